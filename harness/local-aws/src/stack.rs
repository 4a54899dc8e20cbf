//! The stack as `sam deploy` would make it: `local/deploy_stack.py` puts template.yaml through
//! the SAM transform (aws-sam-translator) and moto's CloudFormation, checks that nothing was
//! left unresolved or silently skipped, and describes what was deployed. The run works from
//! that description: the functions' names and environments, the state machines' definitions,
//! the event rule and the schedule are SAM's and CloudFormation's, not a reading of our own.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::eventbridge::InputTransformer;
use crate::Error;

/// Pseudo parameters of the local stack.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Stack {
    pub name: String,
    pub region: String,
    pub account: String,
    pub partition: String,
}

impl Default for Stack {
    fn default() -> Self {
        Self {
            name: "semaphore-local".to_owned(),
            region: "us-east-1".to_owned(),
            // moto's default account: ARNs it builds itself (executions) use it too.
            account: "123456789012".to_owned(),
            partition: "aws".to_owned(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Function {
    pub logical_id: String,
    /// The cargo binary (Metadata.BuildProperties.Binary), which the run starts.
    pub binary: String,
    /// The deployed function's name (CloudFormation's), which invokes name.
    pub name: String,
    pub arn: String,
    pub environment: BTreeMap<String, String>,
    pub memory_mb: u32,
    pub timeout_seconds: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Machine {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
    /// As deployed: the definition file with its DefinitionSubstitutions applied.
    pub definition: String,
    pub definition_uri: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Rule {
    pub name: String,
    pub pattern: serde_json::Value,
    /// The target machine's ARN.
    pub target: String,
    /// What the target gets instead of the event, when the rule transforms it.
    pub transformer: Option<InputTransformer>,
    /// Where EventBridge puts an event it could not deliver.
    pub dead_letter_queue: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Schedule {
    pub name: String,
    pub expression: String,
    pub target: String,
    pub input: String,
}

/// A resource of the translated template that moto's CloudFormation does not create.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Skipped {
    pub logical_id: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Deployed {
    pub stack: Stack,
    /// Every parameter's value as the stack took it (defaults, then overrides).
    pub parameters: BTreeMap<String, String>,
    /// Table name by logical id.
    pub tables: BTreeMap<String, String>,
    pub topics: Vec<String>,
    /// An SQS queue subscribed to every topic: the run reads the notices back from it.
    pub notice_queue_url: String,
    pub functions: Vec<Function>,
    pub machines: Vec<Machine>,
    pub rule: Rule,
    pub schedule: Schedule,
    pub skipped: Vec<Skipped>,
    /// The stack's outputs by key: what it exports for other stacks.
    pub outputs: BTreeMap<String, Output>,
}

/// A stack output, and the name it is exported under (`Fn::ImportValue`), if any.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Output {
    pub value: String,
    pub export: Option<String>,
}

/// A consumer's stack (`examples/consumer/template.yaml`), deployed beside the semaphore's
/// through the same translation: its functions and machines, and its outputs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ConsumerDeployed {
    pub stack: Stack,
    pub functions: Vec<Function>,
    pub machines: Vec<Machine>,
    pub outputs: BTreeMap<String, Output>,
}

impl ConsumerDeployed {
    /// Deploys the consumer template `template` as `stack.name`, as [`Deployed::deploy`] does
    /// the semaphore's.
    pub fn deploy(
        python: &Path,
        root: &Path,
        template: &Path,
        endpoint: &str,
        stack: &Stack,
        parameters: &BTreeMap<String, String>,
        state_timeouts: &BTreeMap<String, u64>,
    ) -> Result<Self, Error> {
        let described = deploy_template(
            python,
            root,
            template,
            endpoint,
            stack,
            parameters,
            state_timeouts,
        )?;
        serde_json::from_slice(&described).map_err(|e| Error::Parse {
            what: "local/deploy_stack.py printed no consumer stack description".to_owned(),
            source: e.into(),
        })
    }

    pub fn machine(&self, logical_id: &str) -> Result<&Machine, Error> {
        self.machines
            .iter()
            .find(|m| m.logical_id == logical_id)
            .ok_or_else(|| Error::NotInStack(format!("state machine {logical_id}")))
    }
}

/// Runs `local/deploy_stack.py` on `template`; its description of the deployed stack (JSON).
/// A template CloudFormation would refuse (a deploy-time rule of the local server's,
/// `patch_deploy_time_rules`) is an [`Error::Deploy`] whose stderr names the rule.
pub fn deploy_template(
    python: &Path,
    root: &Path,
    template: &Path,
    endpoint: &str,
    stack: &Stack,
    parameters: &BTreeMap<String, String>,
    state_timeouts: &BTreeMap<String, u64>,
) -> Result<Vec<u8>, Error> {
    let mut command = std::process::Command::new(python);
    command
        .arg(root.join("local/deploy_stack.py"))
        .args(["--endpoint", endpoint])
        .arg("--template")
        .arg(template)
        .args(["--stack-name", &stack.name, "--region", &stack.region]);
    for (key, value) in parameters {
        command.arg("--parameter").arg(format!("{key}={value}"));
    }
    for (state, seconds) in state_timeouts {
        command
            .arg("--state-timeout")
            .arg(format!("{state}={seconds}"));
    }
    let output = command
        .output()
        .map_err(Error::io(format!("run {}", python.display())))?;
    if !output.status.success() {
        return Err(Error::Deploy {
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(output.stdout)
}

impl Deployed {
    /// Deploys `root`/template.yaml as `stack.name` to the local AWS at `endpoint` with
    /// `parameters` overriding its defaults and the named states' `TimeoutSeconds` set to
    /// `state_timeouts` (a run that compresses time: see `local/deploy_stack.py`; `python` has
    /// the pinned moto and translator).
    pub fn deploy(
        python: &Path,
        root: &Path,
        endpoint: &str,
        stack: &Stack,
        parameters: &BTreeMap<String, String>,
        state_timeouts: &BTreeMap<String, u64>,
    ) -> Result<Self, Error> {
        let described = deploy_template(
            python,
            root,
            &root.join("template.yaml"),
            endpoint,
            stack,
            parameters,
            state_timeouts,
        )?;
        serde_json::from_slice(&described).map_err(|e| Error::Parse {
            what: "local/deploy_stack.py printed no stack description".to_owned(),
            source: e.into(),
        })
    }

    pub fn parameter(&self, name: &str) -> Result<&str, Error> {
        self.parameters
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Error::NotInStack(format!("parameter {name}")))
    }

    /// The protocol's timing the stack gives every function: (horizon, clock skew) in seconds,
    /// its AcquireHorizonSeconds and ClockSkewSeconds parameters. The fence window is their sum.
    pub fn timing_seconds(&self) -> Result<(u64, u64), Error> {
        let seconds = |name: &str| -> Result<u64, Error> {
            let value = self.parameter(name)?;
            value
                .parse()
                .map_err(|e: std::num::ParseIntError| Error::Parse {
                    what: format!("the stack's {name} is {value:?}, not whole seconds"),
                    source: e.into(),
                })
        };
        Ok((
            seconds("AcquireHorizonSeconds")?,
            seconds("ClockSkewSeconds")?,
        ))
    }

    pub fn table(&self, logical_id: &str) -> Result<&str, Error> {
        self.tables
            .get(logical_id)
            .map(String::as_str)
            .ok_or_else(|| Error::NotInStack(format!("table {logical_id}")))
    }

    pub fn machine(&self, logical_id: &str) -> Result<&Machine, Error> {
        self.machines
            .iter()
            .find(|m| m.logical_id == logical_id)
            .ok_or_else(|| Error::NotInStack(format!("state machine {logical_id}")))
    }

    pub fn machine_by_arn(&self, arn: &str) -> Result<&Machine, Error> {
        self.machines
            .iter()
            .find(|m| m.arn == arn)
            .ok_or_else(|| Error::NotInStack(format!("state machine {arn}")))
    }

    /// The machine a function's environment `variable` names (e.g. DEFAULT_WORK).
    pub fn machine_named_by(&self, variable: &str) -> Result<&Machine, Error> {
        let arn = self
            .functions
            .iter()
            .find_map(|f| f.environment.get(variable))
            .ok_or_else(|| Error::NotInStack(format!("function with a {variable}")))?;
        self.machine_by_arn(arn)
    }

    #[cfg(test)]
    pub fn function(&self, binary: &str) -> Result<&Function, Error> {
        self.functions
            .iter()
            .find(|f| f.binary == binary)
            .ok_or_else(|| Error::NotInStack(format!("function built from binary {binary}")))
    }

    /// The machine the event rule starts.
    pub fn rule_target(&self) -> Result<&Machine, Error> {
        self.machine_by_arn(&self.rule.target)
    }

    /// Every notice the stack's topics sent so far, read back from the queue subscribed to
    /// them (and deleted from it): until the queue stays empty.
    pub async fn notices(&self, sdk: &aws_config::SdkConfig) -> Vec<serde_json::Value> {
        let (sqs, queue_url) = (aws_sdk_sqs::Client::new(sdk), &self.notice_queue_url);
        let mut notices = Vec::new();
        let mut empty_rounds = 0;
        while empty_rounds < 2 {
            let received = sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await;
            let Ok(received) = received else {
                empty_rounds += 1;
                continue;
            };
            let messages = received.messages();
            if messages.is_empty() {
                empty_rounds += 1;
                continue;
            }
            empty_rounds = 0;
            for m in messages {
                let envelope: serde_json::Value = m
                    .body()
                    .and_then(|b| serde_json::from_str(b).ok())
                    .unwrap_or(serde_json::Value::Null);
                let notice = envelope["Message"]
                    .as_str()
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(envelope);
                notices.push(notice);
                if let Some(handle) = m.receipt_handle() {
                    let _ = sqs
                        .delete_message()
                        .queue_url(queue_url)
                        .receipt_handle(handle)
                        .send()
                        .await;
                }
            }
        }
        notices
    }

    /// What was deployed, a line each (for a live log): tables, topics, state machines, and
    /// the resources moto's CloudFormation does not create.
    pub fn resources(&self) -> Vec<String> {
        let tables = self
            .tables
            .iter()
            .map(|(id, t)| format!("table          {t} ({id})"));
        let topics = self.topics.iter().map(|topic| {
            let name = crate::sfn::short(topic);
            format!("topic          {name} -> SQS (the notices read back)")
        });
        let machines = self
            .machines
            .iter()
            .map(|m| format!("state machine  {} ({})", m.name, m.definition_uri));
        let skipped = self
            .skipped
            .iter()
            .map(|s| format!("not emulated   {} ({})", s.logical_id, s.kind));
        tables
            .chain(topics)
            .chain(machines)
            .chain(skipped)
            .collect()
    }

    /// The machine the schedule starts.
    pub fn scheduled(&self) -> Result<&Machine, Error> {
        self.machine_by_arn(&self.schedule.target)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    use super::*;

    fn root() -> PathBuf {
        crate::server::repo_root()
    }

    fn python() -> PathBuf {
        std::env::var_os("SEMAPHORE_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join(".venv/bin/python"))
    }

    /// template.yaml deployed to the test server as a stack of its own, with `overrides`.
    pub(crate) fn deploy_with(overrides: &[(&str, &str)]) -> Deployed {
        try_deploy_with(overrides).expect("template.yaml deploys")
    }

    /// [`deploy_with`], or the deploy's error.
    fn try_deploy_with(overrides: &[(&str, &str)]) -> Result<Deployed, Error> {
        let stack = Stack {
            name: crate::sfn::unique("semaphore-test"),
            ..Stack::default()
        };
        let parameters = overrides
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Deployed::deploy(
            &python(),
            &root(),
            crate::server::endpoint(),
            &stack,
            &parameters,
            &BTreeMap::new(),
        )
    }

    /// template.yaml deployed once per test binary with its defaults.
    pub(crate) fn deployed() -> &'static Deployed {
        static DEPLOYED: OnceLock<Deployed> = OnceLock::new();
        DEPLOYED.get_or_init(|| deploy_with(&[]))
    }

    /// template.yaml's parameter declarations, read with the SAM translator's own YAML parser.
    fn declared_parameters() -> serde_json::Value {
        declared("Parameters")
    }

    /// template.yaml's `section`, read with the SAM translator's own YAML parser.
    fn declared(section: &str) -> serde_json::Value {
        let output = std::process::Command::new(python())
            .args([
                "-c",
                "import json, sys; from samtranslator.yaml_helper import yaml_parse; \
                 print(json.dumps(yaml_parse(open(sys.argv[1]).read())[sys.argv[2]]))",
            ])
            .arg(root().join("template.yaml"))
            .arg(section)
            .output()
            .expect("run python");
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).expect("JSON")
    }

    /// Every state of a definition, with those of its Parallel branches and Map item
    /// processors.
    fn every_state(definition: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
        let mut states = Vec::new();
        for (name, state) in definition["States"].as_object().into_iter().flatten() {
            states.push((name.clone(), state.clone()));
            for nested in state["Branches"].as_array().into_iter().flatten() {
                states.extend(every_state(nested));
            }
            for key in ["ItemProcessor", "Iterator"] {
                if state.get(key).is_some() {
                    states.extend(every_state(&state[key]));
                }
            }
        }
        states
    }

    #[test]
    fn every_acquire_state_checks_less_often_than_the_acquire_function_may_run() {
        let stack = deployed();
        let acquire = stack.function("acquire").unwrap();
        let timeout = u64::from(acquire.timeout_seconds);
        // The function's own constant is the template's number...
        assert_eq!(
            timeout,
            lambda_common::ACQUIRE_FUNCTION_TIMEOUT.as_secs(),
            "the acquire function's Timeout in template.yaml is not lambda_common::ACQUIRE_FUNCTION_TIMEOUT"
        );
        // ...and every state that parks on it waits longer than that before it checks again, so
        // one waiter's invocations do not overlap; every state that polls it (no task token:
        // an Express workflow's) holds under a lease and polls again, retrying SemaphoreBusy,
        // well within the poll_seconds that keep its place in line.
        let (mut parked, mut polling) = (0, 0);
        for machine in &stack.machines {
            let definition: serde_json::Value =
                serde_json::from_str(&machine.definition).expect("a definition is JSON");
            for (name, state) in every_state(&definition) {
                if state["Parameters"]["FunctionName"].as_str() != Some(acquire.arn.as_str()) {
                    continue;
                }
                let payload = &state["Parameters"]["Payload"];
                if state["Resource"] == "arn:aws:states:::lambda:invoke" {
                    assert!(
                        payload.get("task_token.$").is_none()
                            && payload["request"]["lease"].as_u64().is_some(),
                        "{}: {name} polls the acquire function without a lease",
                        machine.name
                    );
                    let poll_seconds = payload["request"]["poll_seconds"].as_u64().unwrap_or(60);
                    let busy = state["Retry"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|r| {
                            r["ErrorEquals"]
                                .as_array()
                                .is_some_and(|e| e.contains(&"SemaphoreBusy".into()))
                        })
                        .unwrap_or_else(|| {
                            panic!("{}: {name} does not retry SemaphoreBusy", machine.name)
                        });
                    let longest = busy["MaxDelaySeconds"].as_u64().unwrap_or(u64::MAX);
                    assert!(
                        longest + timeout < poll_seconds,
                        "{}: {name} may poll {longest} s + the function's {timeout} s apart, \
                         past its poll_seconds {poll_seconds}",
                        machine.name
                    );
                    polling += 1;
                    continue;
                }
                assert_eq!(
                    state["Resource"], "arn:aws:states:::lambda:invoke.waitForTaskToken",
                    "{}: {name} invokes the acquire function neither parked nor polling",
                    machine.name
                );
                let checks_every = state["TimeoutSeconds"].as_u64().unwrap_or_default();
                assert!(
                    checks_every > timeout,
                    "{}: {name} times out after {checks_every} s, not after the acquire \
                     function's {timeout} s",
                    machine.name
                );
                parked += 1;
            }
        }
        assert!(
            parked >= 2,
            "the lock-protected machine and the fragment acquire"
        );
        assert!(
            polling >= 2,
            "the Express fragment and the Distributed Map's children poll"
        );
        let parameters = declared_parameters();
        let bound = |name: &str, bound: &str| {
            parameters[name][bound]
                .as_u64()
                .unwrap_or_else(|| panic!("template.yaml: {name} has no whole {bound}"))
        };
        assert_eq!(
            bound("MaxWaitSeconds", "MinValue")..=bound("MaxWaitSeconds", "MaxValue"),
            lambda_common::MAX_WAIT_RANGE,
            "MaxWaitSeconds' bounds are the function's"
        );
    }

    #[test]
    fn the_deployed_stack_has_every_function_machine_and_substitution() {
        let stack = deployed();
        let binaries: Vec<&str> = stack.functions.iter().map(|f| f.binary.as_str()).collect();
        assert_eq!(binaries, ["acquire", "release", "cleanup", "sweeper"]);
        let table = stack.table("SemaphoreTable").unwrap();
        let queue = stack.table("QueueTable").unwrap();
        // Every function gets the protocol's timing from the template's two parameters (the
        // fence window is computed from them; there is no window parameter to get wrong).
        assert_eq!(stack.timing_seconds().unwrap(), (8, 2));
        let lock = stack.parameter("LockName").unwrap();
        for f in &stack.functions {
            let env = |name: &str| f.environment.get(name).map(String::as_str);
            assert_eq!(env("TABLE_NAME"), Some(table), "{}", f.binary);
            assert_eq!(env("QUEUE_TABLE_NAME"), Some(queue), "{}", f.binary);
            assert_eq!(env("ACQUIRE_HORIZON_SECONDS"), Some("8"), "{}", f.binary);
            assert_eq!(env("CLOCK_SKEW_SECONDS"), Some("2"), "{}", f.binary);
            assert_eq!(env("FENCE_WINDOW_SECONDS"), None, "{}", f.binary);
            // Every function resolves an execution's lock alike.
            assert_eq!(env("DEFAULT_LOCK"), Some(lock), "{}", f.binary);
            // A function's name is CloudFormation's, and invokes name its ARN.
            assert!(f.arn.ends_with(&format!(":function:{}", f.name)), "{f:?}");
        }
        let protected = stack.machine("LockProtectedStateMachine").unwrap();
        let example = stack.machine("YourWorkflowExampleStateMachine").unwrap();
        let demo = stack.machine("DemoWorkStateMachine").unwrap();
        let runner = stack.machine("WorkFunctionStateMachine").unwrap();
        assert_eq!(
            demo.arn,
            format!(
                "arn:aws:states:us-east-1:123456789012:stateMachine:{}-demo-work",
                stack.stack.name
            )
        );
        let acquire = stack.function("acquire").unwrap();
        let env = |f: &Function, name: &str| f.environment[name].clone();
        assert_eq!(env(acquire, "DEFAULT_LIMIT"), "5");
        assert_eq!(env(acquire, "MAX_WAIT_SECONDS"), "86400");
        assert_eq!(env(acquire, "DEFAULT_WORK"), demo.arn);
        // The default lists are empty: the demo work only, no function.
        assert_eq!(env(acquire, "WORK_STATE_MACHINES"), demo.arn);
        assert_eq!(env(acquire, "WORK_FUNCTIONS"), "");
        assert_eq!(env(acquire, "WORK_FUNCTION_RUNNER"), runner.arn);
        let cleanup = stack.function("cleanup").unwrap();
        assert_eq!(env(cleanup, "ACQUIRE_FUNCTION_ARN"), acquire.arn);
        assert_eq!(env(cleanup, "WORK_FUNCTION_RUNNER"), runner.arn);
        let sweeper = stack.function("sweeper").unwrap();
        assert_eq!(stack.topics.len(), 1);
        assert_eq!(env(sweeper, "TOPIC_ARN"), stack.topics[0]);
        assert_eq!(
            env(sweeper, "PROTECTED_STATE_MACHINES"),
            format!("{},{}", protected.arn, example.arn)
        );
        // The definitions as deployed: substituted, the context object's `$$.` kept.
        for machine in &stack.machines {
            assert!(!machine.definition.contains("${"), "{}", machine.name);
        }
        let definition: serde_json::Value = serde_json::from_str(&protected.definition).unwrap();
        let acquire_state = &definition["States"]["Acquire slot"]["Parameters"];
        assert_eq!(acquire_state["FunctionName"], acquire.arn.as_str());
        assert_eq!(acquire_state["Payload"]["state.$"], "$$.State");
        assert_eq!(
            stack.rule_target().unwrap().logical_id,
            "CleanupStateMachine"
        );
        assert_eq!(
            stack.rule.pattern["detail"]["stateMachineArn"],
            serde_json::json!([protected.arn, example.arn])
        );
        assert_eq!(stack.scheduled().unwrap().logical_id, "SweeperStateMachine");
        assert_eq!(stack.schedule.expression, "rate(5 minutes)");
        assert_eq!(stack.machines.len(), 9);
        // What moto's CloudFormation does not create is listed, not silently missing: only the
        // dead-letter queue's policy (the alarms are made by local/moto_server.py's patch).
        let skipped: Vec<&str> = stack.skipped.iter().map(|s| s.kind.as_str()).collect();
        assert_eq!(skipped, ["AWS::SQS::QueuePolicy"]);
    }

    /// template.yaml deployed as shipped under a consumer-prefix choice, with or without an
    /// alert address: a deploy only, no run. CloudFormation's deploy-time rules hold under
    /// each (F16: the local server refuses what CloudFormation refuses, local/moto_server.py's
    /// patch_deploy_time_rules; the first `sam deploy` with samconfig.toml's empty prefix
    /// failed on an empty export).
    fn deploys_under(prefix: &str, alert_email: Option<&str>) {
        let mut overrides = vec![("ProtectedStateMachinePrefix", prefix)];
        if prefix == "*" {
            // Every machine of the account is covered only when the operator says so.
            overrides.push(("AllowAccountWidePrefixes", "true"));
        }
        if let Some(email) = alert_email {
            overrides.push(("AlertEmail", email));
        }
        let stack = deploy_with(&overrides);
        assert_eq!(
            stack.parameter("ProtectedStateMachinePrefix").unwrap(),
            prefix
        );
        assert_eq!(
            stack.parameter("AlertEmail").unwrap(),
            alert_email.unwrap_or("")
        );
        for (key, output) in &stack.outputs {
            if let Some(export) = &output.export {
                assert!(
                    !output.value.trim().is_empty(),
                    "{key} exports {export} empty"
                );
            }
        }
    }

    #[test]
    fn the_stack_deploys_covering_only_its_own_machines() {
        deploys_under("", None);
    }

    #[test]
    fn the_stack_deploys_covering_only_its_own_machines_with_an_alert_email() {
        deploys_under("", Some("ops@example.com"));
    }

    #[test]
    fn the_stack_deploys_covering_a_prefix() {
        deploys_under("team-", None);
    }

    #[test]
    fn the_stack_deploys_covering_a_prefix_with_an_alert_email() {
        deploys_under("team-", Some("ops@example.com"));
    }

    #[test]
    fn the_stack_deploys_covering_every_machine() {
        deploys_under("*", None);
    }

    #[test]
    fn the_stack_deploys_covering_every_machine_with_an_alert_email() {
        deploys_under("*", Some("ops@example.com"));
    }

    /// A "*" prefix reaches every machine or function of the account and region: the template's
    /// Rules (AccountWidePrefixesAcknowledged) refuse it unless AllowAccountWidePrefixes is
    /// "true", as CloudFormation does before it creates anything, and the local server now
    /// evaluates them (local/moto_server.py, patch_deploy_time_rules). With the acknowledgement
    /// the stack deploys: the_stack_deploys_covering_every_machine.
    #[test]
    fn an_account_wide_prefix_is_refused_unless_acknowledged() {
        let description = declared("Rules")["AccountWidePrefixesAcknowledged"]["Assertions"][0]
            ["AssertDescription"]
            .as_str()
            .expect("the rule's AssertDescription")
            .to_owned();
        for prefix in [
            "ProtectedStateMachinePrefix",
            "WorkStateMachinePrefix",
            "WorkFunctionPrefix",
        ] {
            for acknowledgement in [None, Some("false")] {
                let mut overrides = vec![(prefix, "*")];
                overrides.extend(acknowledgement.map(|a| ("AllowAccountWidePrefixes", a)));
                match try_deploy_with(&overrides) {
                    Ok(_) => panic!("{overrides:?} deployed unacknowledged"),
                    Err(Error::Deploy { status, stderr }) => {
                        assert!(!status.success());
                        assert!(
                            stderr.contains(&format!(": {description}")),
                            "{overrides:?}: not the template's AssertDescription: {stderr}"
                        );
                    }
                    Err(other) => panic!("deploy_stack.py did not run: {other}"),
                }
            }
        }
    }

    #[test]
    fn prefixes_reach_the_environment_and_the_rule() {
        let stack = deploy_with(&[
            ("WorkStateMachinePrefix", "work-"),
            ("WorkFunctionPrefix", "fn-"),
            ("ProtectedStateMachinePrefix", "team-"),
        ]);
        let demo = &stack.machine("DemoWorkStateMachine").unwrap().arn;
        let machines = demo.rsplit_once(':').unwrap().0;
        let acquire = &stack.function("acquire").unwrap().environment;
        assert_eq!(
            acquire["WORK_STATE_MACHINES"],
            format!("{demo},{machines}:work-*")
        );
        assert_eq!(
            acquire["WORK_FUNCTIONS"],
            "arn:aws:lambda:us-east-1:123456789012:function:fn-*"
        );
        let protected = stack.machine("LockProtectedStateMachine").unwrap();
        let example = stack.machine("YourWorkflowExampleStateMachine").unwrap();
        assert_eq!(
            stack.rule.pattern["detail"]["stateMachineArn"],
            serde_json::json!([protected.arn, example.arn, {"prefix": format!("{machines}:team-")}])
        );
        assert_eq!(
            stack.function("sweeper").unwrap().environment["PROTECTED_STATE_MACHINES"],
            format!("{},{},{machines}:team-*", protected.arn, example.arn)
        );
        // What a consumer stack imports: the functions, the prefix, the tables.
        let export = |key: &str| stack.outputs[key].export.clone();
        for key in [
            "AcquireFunctionArn",
            "ReleaseFunctionArn",
            "ProtectedStateMachinePrefix",
            "SemaphoreTableName",
            "QueueTableName",
        ] {
            assert_eq!(
                export(key),
                Some(format!("{}-{key}", stack.stack.name)),
                "{key}"
            );
        }
        assert_eq!(stack.outputs["ProtectedStateMachinePrefix"].value, "team-");
        // A consumer's stack of its own (examples/consumer), deployed after the semaphore's
        // through the same translation: its machine is named under the imported prefix and
        // calls the imported functions.
        let consumer = ConsumerDeployed::deploy(
            &python(),
            &root(),
            &root().join("examples/consumer/template.yaml"),
            crate::server::endpoint(),
            &Stack {
                name: crate::sfn::unique("consumer-test"),
                ..Stack::default()
            },
            &BTreeMap::from([("SemaphoreStackName".to_owned(), stack.stack.name.clone())]),
            &BTreeMap::new(),
        )
        .expect("examples/consumer/template.yaml deploys");
        let orders = consumer.machine("OrdersStateMachine").unwrap();
        assert_eq!(orders.name, "team-orders");
        let acquire_arn = &stack.function("acquire").unwrap().arn;
        assert!(orders.definition.contains(acquire_arn.as_str()));
        assert_eq!(consumer.functions[0].binary, "consumer-work");
        // "*": every machine of the account and region, but the cleanup machine itself.
        let every = deploy_with(&[
            ("ProtectedStateMachinePrefix", "*"),
            ("AllowAccountWidePrefixes", "true"),
        ]);
        let cleanup = every.machine("CleanupStateMachine").unwrap();
        assert_eq!(
            every.rule.pattern["detail"]["stateMachineArn"],
            serde_json::json!([{"anything-but": [cleanup.arn]}])
        );
    }
}
