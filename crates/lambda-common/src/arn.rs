//! Step Functions ARNs, as far as the cleanup function and the sweeper need them: is a holder an
//! execution, of which state machine, and which execution a `startExecution` task started.

use std::fmt;

/// Standard executions can be asked about with `DescribeExecution`; Express executions cannot
/// (the API does not support them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionKind {
    Standard,
    Express,
}

/// `arn:<partition>:states:<region>:<account>:execution:<machine>:<name>` or
/// `arn:<partition>:states:<region>:<account>:express:<machine>:<name>:<id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionArn {
    pub partition: String,
    pub region: String,
    pub account: String,
    pub kind: ExecutionKind,
    /// The state machine's name (for a Distributed Map child: `<machine>/<map run label>`).
    pub machine: String,
    pub name: String,
}

/// `arn:<partition>:states:<region>:<account>:stateMachine:<name>[:<version or alias>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMachineArn {
    pub partition: String,
    pub region: String,
    pub account: String,
    pub name: String,
}

fn is_account(s: &str) -> bool {
    s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit())
}

fn is_region(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_partition(s: &str) -> bool {
    s.starts_with("aws") && is_region(s)
}

/// `arn:<partition>:states:<region>:<account>:` and the rest, split on ':'.
fn states_arn(text: &str) -> Option<(&str, &str, &str, Vec<&str>)> {
    let parts: Vec<&str> = text.split(':').collect();
    match parts.as_slice() {
        ["arn", partition, "states", region, account, rest @ ..]
            if is_partition(partition) && is_region(region) && is_account(account) =>
        {
            Some((partition, region, account, rest.to_vec()))
        }
        _ => None,
    }
}

impl ExecutionArn {
    pub fn parse(text: &str) -> Option<Self> {
        let (partition, region, account, rest) = states_arn(text)?;
        let (kind, machine, name) = match rest.as_slice() {
            ["execution", machine, name] => (ExecutionKind::Standard, *machine, *name),
            ["express", machine, name, id] if !id.is_empty() => {
                (ExecutionKind::Express, *machine, *name)
            }
            _ => return None,
        };
        if machine.is_empty() || name.is_empty() {
            return None;
        }
        Some(Self {
            partition: partition.to_owned(),
            region: region.to_owned(),
            account: account.to_owned(),
            kind,
            machine: machine.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl StateMachineArn {
    pub fn parse(text: &str) -> Option<Self> {
        let (partition, region, account, rest) = states_arn(text)?;
        let name = match rest.as_slice() {
            ["stateMachine", name] | ["stateMachine", name, _] if !name.is_empty() => *name,
            _ => return None,
        };
        Some(Self {
            partition: partition.to_owned(),
            region: region.to_owned(),
            account: account.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Whether `execution` is an execution of this state machine (of any version or alias, or
    /// a Distributed Map child of it).
    pub fn owns(&self, execution: &ExecutionArn) -> bool {
        let machine = execution
            .machine
            .split_once('/')
            .map_or(execution.machine.as_str(), |(m, _)| m);
        execution.partition == self.partition
            && execution.region == self.region
            && execution.account == self.account
            && machine == self.name
    }

    /// The ARN of this machine's standard execution named `name`: what `StartExecution` of this
    /// machine (any version or alias of it) with that name makes.
    pub fn execution(&self, name: &str) -> String {
        format!(
            "arn:{}:states:{}:{}:execution:{}:{name}",
            self.partition, self.region, self.account, self.name
        )
    }
}

impl fmt::Display for StateMachineArn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "arn:{}:states:{}:{}:stateMachine:{}",
            self.partition, self.region, self.account, self.name
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_arns_are_recognised() {
        let standard = ExecutionArn::parse(
            "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1",
        )
        .unwrap();
        assert_eq!(standard.kind, ExecutionKind::Standard);
        assert_eq!(standard.machine, "LockProtected");
        assert_eq!(standard.name, "run-1");
        let express = ExecutionArn::parse(
            "arn:aws-cn:states:cn-north-1:123456789012:express:M:e:5f1c2a9e-0000-4c4c-8d8d-1234",
        )
        .unwrap();
        assert_eq!(express.kind, ExecutionKind::Express);
        assert_eq!(express.partition, "aws-cn");
        for not_one in [
            "exec-1",
            "",
            "arn:aws:states:us-east-1:123456789012:stateMachine:M",
            "arn:aws:states:us-east-1:123456789012:execution:M",
            "arn:aws:states:us-east-1:123456789012:execution:M:",
            "arn:aws:states:us-east-1:123456789012:execution:M:e:extra",
            "arn:aws:states:us-east-1:12345:execution:M:e",
            "arn:aws:lambda:us-east-1:123456789012:execution:M:e",
            "arn:aws:states:US-EAST-1:123456789012:execution:M:e",
        ] {
            assert_eq!(ExecutionArn::parse(not_one), None, "{not_one}");
        }
    }

    #[test]
    fn a_state_machine_owns_its_executions_only() {
        let machine = StateMachineArn::parse(
            "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected",
        )
        .unwrap();
        let exec = |s: &str| ExecutionArn::parse(s).unwrap();
        assert!(machine.owns(&exec(
            "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1"
        )));
        assert!(machine.owns(&exec(
            "arn:aws:states:us-east-1:123456789012:execution:LockProtected/map-run:child"
        )));
        assert!(!machine.owns(&exec(
            "arn:aws:states:us-east-1:123456789012:execution:Other:run-1"
        )));
        assert!(!machine.owns(&exec(
            "arn:aws:states:eu-west-1:123456789012:execution:LockProtected:run-1"
        )));
        assert!(!machine.owns(&exec(
            "arn:aws:states:us-east-1:210987654321:execution:LockProtected:run-1"
        )));
        assert_eq!(
            StateMachineArn::parse("arn:aws:states:us-east-1:123456789012:stateMachine:M:3")
                .unwrap()
                .name,
            "M"
        );
        assert_eq!(
            StateMachineArn::parse("arn:aws:states:us-east-1:123456789012:execution:M:e"),
            None
        );
        assert_eq!(
            machine.to_string(),
            "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected"
        );
    }

    #[test]
    fn a_machine_names_the_executions_it_starts() {
        let versioned =
            StateMachineArn::parse("arn:aws:states:us-east-1:123456789012:stateMachine:Work:7")
                .unwrap();
        let execution = versioned.execution("run-1");
        assert_eq!(
            execution,
            "arn:aws:states:us-east-1:123456789012:execution:Work:run-1"
        );
        let parsed = ExecutionArn::parse(&execution).unwrap();
        assert!(versioned.owns(&parsed));
    }
}
