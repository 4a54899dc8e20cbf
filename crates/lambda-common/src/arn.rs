//! Step Functions ARNs, as far as the cleanup function and the sweeper need them: is a holder an
//! execution, of which state machine, and which execution a `startExecution` task started; and
//! sets of ARNs written as IAM writes them ([`ArnPatterns`]), by which a stack names the machines
//! and functions of other stacks without a list to redeploy for each one.

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
        execution.state_machine() == *self
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

impl ExecutionArn {
    /// The ARN of the (unqualified) state machine this is an execution of; for a Distributed
    /// Map child, of the machine that ran the map.
    pub fn state_machine(&self) -> StateMachineArn {
        let machine = self
            .machine
            .split_once('/')
            .map_or(self.machine.as_str(), |(m, _)| m);
        StateMachineArn {
            partition: self.partition.clone(),
            region: self.region.clone(),
            account: self.account.clone(),
            name: machine.to_owned(),
        }
    }
}

/// A set of ARNs as an IAM policy names them: each entry exact, or ending in `*` for every ARN
/// that begins with what precedes it (`arn:aws:states:us-east-1:123456789012:stateMachine:orders-*`:
/// every machine whose name starts with `orders-`). A prefix covers machines created after the
/// stack was deployed, which an ARN list cannot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArnPatterns(Vec<ArnPattern>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum ArnPattern {
    Exact(String),
    Prefix(String),
}

impl ArnPatterns {
    /// Comma-separated entries, blanks skipped and duplicates dropped. `valid` judges an ARN: an
    /// exact entry must be one, a prefix must be the beginning of one (it is asked about the
    /// prefix followed by one more name character). Errs with the first entry that is neither.
    pub fn parse(text: &str, valid: impl Fn(&str) -> bool) -> Result<Self, String> {
        let mut patterns = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let pattern = match part.strip_suffix('*') {
                Some(prefix) if !prefix.contains('*') && valid(&format!("{prefix}a")) => {
                    ArnPattern::Prefix(prefix.to_owned())
                }
                None if !part.contains('*') && valid(part) => ArnPattern::Exact(part.to_owned()),
                _ => return Err(part.to_owned()),
            };
            if !patterns.contains(&pattern) {
                patterns.push(pattern);
            }
        }
        Ok(Self(patterns))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `arn` is one of the exact entries or begins with one of the prefixes.
    pub fn matches(&self, arn: &str) -> bool {
        self.0.iter().any(|p| match p {
            ArnPattern::Exact(exact) => exact == arn,
            ArnPattern::Prefix(prefix) => arn.starts_with(prefix.as_str()),
        })
    }

    /// Whether `execution` is an execution of one of these state machines (of any version or
    /// alias of it, or a Distributed Map child of it).
    pub fn covers(&self, execution: &ExecutionArn) -> bool {
        let machine = execution.state_machine().to_string();
        self.0.iter().any(|p| match p {
            ArnPattern::Exact(exact) => {
                StateMachineArn::parse(exact).is_some_and(|m| m.to_string() == machine)
            }
            ArnPattern::Prefix(prefix) => machine.starts_with(prefix.as_str()),
        })
    }
}

/// The one machine, exactly.
impl From<StateMachineArn> for ArnPatterns {
    fn from(machine: StateMachineArn) -> Self {
        Self(vec![ArnPattern::Exact(machine.to_string())])
    }
}

impl fmt::Display for ArnPatterns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match p {
                ArnPattern::Exact(exact) => f.write_str(exact)?,
                ArnPattern::Prefix(prefix) => write!(f, "{prefix}*")?,
            }
        }
        Ok(())
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

    #[test]
    fn patterns_match_exact_arns_and_prefixes_as_iam_does() {
        let machine = |a: &str| StateMachineArn::parse(a).is_some();
        let patterns = ArnPatterns::parse(
            "arn:aws:states:us-east-1:123456789012:stateMachine:lock-protected, ,\
             arn:aws:states:us-east-1:123456789012:stateMachine:orders-*,\
             arn:aws:states:us-east-1:123456789012:stateMachine:orders-*",
            machine,
        )
        .unwrap();
        assert_eq!(
            patterns.to_string(),
            "arn:aws:states:us-east-1:123456789012:stateMachine:lock-protected, \
             arn:aws:states:us-east-1:123456789012:stateMachine:orders-*"
        );
        let exec = |s: &str| ExecutionArn::parse(s).unwrap();
        for covered in [
            "arn:aws:states:us-east-1:123456789012:execution:lock-protected:run-1",
            "arn:aws:states:us-east-1:123456789012:execution:orders-eu:run-1",
            "arn:aws:states:us-east-1:123456789012:execution:orders-:run-1",
            "arn:aws:states:us-east-1:123456789012:execution:orders-eu/map:child",
        ] {
            assert!(patterns.covers(&exec(covered)), "{covered}");
        }
        for not_covered in [
            "arn:aws:states:us-east-1:123456789012:execution:lock-protected-2:run-1",
            "arn:aws:states:us-east-1:123456789012:execution:orders:run-1",
            "arn:aws:states:eu-west-1:123456789012:execution:orders-eu:run-1",
            "arn:aws:states:us-east-1:210987654321:execution:orders-eu:run-1",
        ] {
            assert!(!patterns.covers(&exec(not_covered)), "{not_covered}");
        }
        assert!(patterns.matches("arn:aws:states:us-east-1:123456789012:stateMachine:orders-x"));
        assert!(!patterns.matches("arn:aws:states:us-east-1:123456789012:stateMachine:order"));
        // Every machine of the account and region.
        let every = ArnPatterns::parse(
            "arn:aws:states:us-east-1:123456789012:stateMachine:*",
            machine,
        )
        .unwrap();
        assert!(every.covers(&exec(
            "arn:aws:states:us-east-1:123456789012:execution:any:e"
        )));
        assert!(ArnPatterns::parse("", machine).unwrap().is_empty());
        for bad in [
            "arn:aws:states:us-east-1:123456789012:stateMachine:a*b",
            "arn:aws:states:us-east-1:123456789012:stateMachine:**",
            "arn:aws:states:us-east-1:*",
            "orders-*",
            "*",
        ] {
            assert_eq!(
                ArnPatterns::parse(bad, machine),
                Err(bad.to_owned()),
                "{bad}"
            );
        }
    }
}
