//! "Deploys" from `template.yaml` itself: reads the SAM template, resolves the intrinsic
//! functions the template uses (`Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If`, `Fn::Join`,
//! `Fn::Split`, conditions, ...) to local names and ARNs, `CommaDelimitedList` parameters as
//! lists, and produces the plan of what to create on the local AWS: the table,
//! the topics, the functions (binary and environment) and every state machine with its
//! definition file and `DefinitionSubstitutions` applied, its EventBridge rules and schedules.
//!
//! Nothing here is copied from the template by hand, so the local run cannot drift from what
//! `sam deploy` ships: change the template and the local run changes with it. Resources the
//! local AWS does not need (log groups, IAM, alarms, e-mail subscriptions) are listed as skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::{Mapping, Value};

/// Pseudo parameters of the local stack.
#[derive(Debug, Clone, PartialEq, Eq)]
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePlan {
    pub logical_id: String,
    pub name: String,
    /// (attribute name, type S/N/B)
    pub attributes: Vec<(String, String)>,
    /// (attribute name, HASH/RANGE)
    pub key_schema: Vec<(String, String)>,
    pub billing_mode: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPlan {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionPlan {
    pub logical_id: String,
    /// The cargo binary (Metadata.BuildProperties.Binary); also the local function name.
    pub binary: String,
    pub arn: String,
    /// Globals.Function.Environment merged with the function's own (the function's win).
    pub environment: BTreeMap<String, String>,
    pub memory_mb: u32,
    pub timeout_seconds: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RulePlan {
    pub name: String,
    /// The event pattern, intrinsics resolved.
    pub pattern: serde_json::Value,
    /// What the target gets instead of the event, when the rule transforms it.
    pub transformer: Option<crate::events::InputTransformer>,
    /// Where EventBridge puts an event it could not deliver: the queue's logical id (SAM's
    /// `DeadLetterConfig` with `Type: SQS`) or ARN.
    pub dead_letter_queue: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulePlan {
    pub name: String,
    pub expression: String,
    /// The period of a `rate(...)` expression; `None` for `cron(...)`.
    pub period: Option<Duration>,
    pub input: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MachinePlan {
    pub logical_id: String,
    pub name: String,
    pub arn: String,
    pub definition_uri: String,
    /// The definition file with every `${Key}` of `DefinitionSubstitutions` replaced.
    pub definition: String,
    pub substitutions: BTreeMap<String, String>,
    pub machine_type: String,
    pub rules: Vec<RulePlan>,
    pub schedules: Vec<SchedulePlan>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub stack: Stack,
    /// Every parameter's value (defaults, then overrides).
    pub parameters: BTreeMap<String, String>,
    /// The semaphore table (the functions' `TABLE_NAME`).
    pub table: TablePlan,
    /// Every other table (the waiters' `QUEUE_TABLE_NAME`).
    pub other_tables: Vec<TablePlan>,
    pub topics: Vec<TopicPlan>,
    pub functions: Vec<FunctionPlan>,
    pub machines: Vec<MachinePlan>,
    /// (logical id, type) of resources the local AWS does not create.
    pub skipped: Vec<(String, String)>,
}

impl Plan {
    /// The lock the template's functions use (its LockName parameter).
    pub fn lock_name(&self) -> Result<String, String> {
        self.parameters
            .get("LockName")
            .cloned()
            .ok_or_else(|| "template.yaml has no LockName parameter".to_owned())
    }

    /// The protocol's timing the template gives every function: (horizon, clock skew) in
    /// seconds, its AcquireHorizonSeconds and ClockSkewSeconds parameters. The fence window is
    /// their sum.
    pub fn timing_seconds(&self) -> Result<(u64, u64), String> {
        let seconds = |name: &str| -> Result<u64, String> {
            let value = self
                .parameters
                .get(name)
                .ok_or_else(|| format!("template.yaml has no {name} parameter"))?;
            value
                .parse()
                .map_err(|_| format!("template.yaml: {name} is {value:?}, not whole seconds"))
        };
        Ok((
            seconds("AcquireHorizonSeconds")?,
            seconds("ClockSkewSeconds")?,
        ))
    }

    pub fn machine(&self, logical_id: &str) -> Result<&MachinePlan, String> {
        self.machines
            .iter()
            .find(|m| m.logical_id == logical_id)
            .ok_or_else(|| format!("template.yaml has no state machine {logical_id}"))
    }

    #[cfg(test)]
    pub fn function(&self, binary: &str) -> Result<&FunctionPlan, String> {
        self.functions
            .iter()
            .find(|f| f.binary == binary)
            .ok_or_else(|| format!("template.yaml has no function built from binary {binary}"))
    }

    /// The one state machine started by a rule (EventBridge target) and the rule.
    pub fn rule_target(&self) -> Result<(&MachinePlan, &RulePlan), String> {
        let mut found = self
            .machines
            .iter()
            .flat_map(|m| m.rules.iter().map(move |r| (m, r)));
        let first = found
            .next()
            .ok_or("template.yaml has no EventBridgeRule event on any state machine")?;
        if found.next().is_some() {
            return Err(
                "template.yaml has more than one EventBridgeRule event: the local \
                        run plays exactly one"
                    .to_owned(),
            );
        }
        Ok(first)
    }

    /// The one state machine started on a schedule, and the schedule.
    pub fn scheduled(&self) -> Result<(&MachinePlan, &SchedulePlan), String> {
        let mut found = self
            .machines
            .iter()
            .flat_map(|m| m.schedules.iter().map(move |s| (m, s)));
        let first = found
            .next()
            .ok_or("template.yaml has no Schedule event on any state machine")?;
        if found.next().is_some() {
            return Err(
                "template.yaml has more than one Schedule event: the local run plays \
                        exactly one"
                    .to_owned(),
            );
        }
        Ok(first)
    }
}

/// The parsed template and what resolution needs.
pub struct Template {
    root: Mapping,
    dir: PathBuf,
    stack: Stack,
    /// Every parameter's value as given (a list parameter's items joined with commas).
    parameters: BTreeMap<String, String>,
    /// The parameters whose `Ref` is a list (`CommaDelimitedList`, `List<...>`).
    lists: std::collections::BTreeSet<String>,
}

/// The result of resolving `AWS::NoValue`: the property is dropped.
const NO_VALUE: &str = "\u{0}AWS::NoValue";

fn tag_name(tag: &serde_yaml::value::Tag) -> String {
    tag.to_string().trim_start_matches('!').to_owned()
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn get<'a>(map: &'a Mapping, key: &str) -> Option<&'a Value> {
    map.get(Value::String(key.to_owned()))
}

fn as_map<'a>(value: Option<&'a Value>, what: &str) -> Result<&'a Mapping, String> {
    match value {
        Some(Value::Mapping(m)) => Ok(m),
        Some(other) => Err(format!("{what}: expected a mapping, got {other:?}")),
        None => Err(format!("{what}: missing")),
    }
}

impl Template {
    pub fn load(
        path: &Path,
        stack: Stack,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::parse(&text, dir, stack, overrides)
    }

    pub fn parse(
        text: &str,
        dir: PathBuf,
        stack: Stack,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let root: Value =
            serde_yaml::from_str(text).map_err(|e| format!("template.yaml is not YAML: {e}"))?;
        let Value::Mapping(root) = root else {
            return Err("template.yaml: the top level is not a mapping".to_owned());
        };
        let mut parameters = BTreeMap::new();
        let mut lists = std::collections::BTreeSet::new();
        if let Some(Value::Mapping(declared)) = get(&root, "Parameters") {
            for (name, spec) in declared {
                let name = scalar(name).ok_or("template.yaml: a parameter name is not a string")?;
                let (default, kind) = match spec {
                    Value::Mapping(spec) => (
                        get(spec, "Default").and_then(scalar),
                        get(spec, "Type").and_then(scalar).unwrap_or_default(),
                    ),
                    _ => (None, String::new()),
                };
                if kind == "CommaDelimitedList" || kind.starts_with("List<") {
                    lists.insert(name.clone());
                }
                if let Some(value) = overrides.get(&name).cloned().or(default) {
                    parameters.insert(name, value);
                }
            }
        }
        for name in overrides.keys() {
            if !parameters.contains_key(name) {
                return Err(format!("template.yaml declares no parameter {name}"));
            }
        }
        Ok(Self {
            root,
            dir,
            stack,
            parameters,
            lists,
        })
    }

    fn resources(&self) -> Result<&Mapping, String> {
        as_map(get(&self.root, "Resources"), "template.yaml Resources")
    }

    fn resource(&self, logical_id: &str) -> Result<&Mapping, String> {
        as_map(
            get(self.resources()?, logical_id),
            &format!("resource {logical_id}"),
        )
    }

    fn resource_type(&self, logical_id: &str) -> Result<String, String> {
        get(self.resource(logical_id)?, "Type")
            .and_then(scalar)
            .ok_or_else(|| format!("resource {logical_id} has no Type"))
    }

    fn property(&self, logical_id: &str, name: &str) -> Result<Option<String>, String> {
        let resource = self.resource(logical_id)?;
        let Some(Value::Mapping(props)) = get(resource, "Properties") else {
            return Ok(None);
        };
        match get(props, name) {
            None => Ok(None),
            Some(v) => Ok(Some(self.resolve_string(v)?)),
        }
    }

    fn default_name(&self, logical_id: &str) -> String {
        format!("{}-{logical_id}", self.stack.name)
    }

    fn arn(&self, service: &str, resource: &str) -> String {
        let Stack {
            partition,
            region,
            account,
            ..
        } = &self.stack;
        match service {
            "iam" => format!("arn:{partition}:iam::{account}:{resource}"),
            _ => format!("arn:{partition}:{service}:{region}:{account}:{resource}"),
        }
    }

    fn function_binary(&self, logical_id: &str) -> Result<String, String> {
        let resource = self.resource(logical_id)?;
        let binary = match get(resource, "Metadata") {
            Some(Value::Mapping(meta)) => match get(meta, "BuildProperties") {
                Some(Value::Mapping(build)) => get(build, "Binary").and_then(scalar),
                _ => None,
            },
            _ => None,
        };
        binary.ok_or_else(|| {
            format!(
                "function {logical_id} has no Metadata.BuildProperties.Binary: the local run \
                 runs the cargo binary it names"
            )
        })
    }

    fn machine_name(&self, logical_id: &str) -> Result<String, String> {
        Ok(self
            .property(logical_id, "Name")?
            .unwrap_or_else(|| self.default_name(logical_id)))
    }

    /// What `Ref` gives for a resource.
    fn ref_resource(&self, logical_id: &str) -> Result<String, String> {
        let kind = self.resource_type(logical_id)?;
        Ok(match kind.as_str() {
            "AWS::DynamoDB::Table" => self
                .property(logical_id, "TableName")?
                .unwrap_or_else(|| self.default_name(logical_id)),
            "AWS::SNS::Topic" => {
                let name = self
                    .property(logical_id, "TopicName")?
                    .unwrap_or_else(|| self.default_name(logical_id));
                self.arn("sns", &name)
            }
            "AWS::Serverless::Function" | "AWS::Lambda::Function" => {
                self.function_binary(logical_id)?
            }
            "AWS::Serverless::StateMachine" | "AWS::StepFunctions::StateMachine" => {
                let name = self.machine_name(logical_id)?;
                self.arn("states", &format!("stateMachine:{name}"))
            }
            "AWS::Logs::LogGroup" => self
                .property(logical_id, "LogGroupName")?
                .unwrap_or_else(|| self.default_name(logical_id)),
            "AWS::IAM::ManagedPolicy" => {
                self.arn("iam", &format!("policy/{}", self.default_name(logical_id)))
            }
            _ => self.default_name(logical_id),
        })
    }

    fn get_att(&self, logical_id: &str, attribute: &str) -> Result<String, String> {
        let kind = self.resource_type(logical_id)?;
        let value = match (kind.as_str(), attribute) {
            ("AWS::DynamoDB::Table", "Arn") => {
                let name = self.ref_resource(logical_id)?;
                self.arn("dynamodb", &format!("table/{name}"))
            }
            ("AWS::Serverless::Function" | "AWS::Lambda::Function", "Arn") => {
                let name = self.ref_resource(logical_id)?;
                self.arn("lambda", &format!("function:{name}"))
            }
            ("AWS::Serverless::StateMachine" | "AWS::StepFunctions::StateMachine", "Arn") => {
                self.ref_resource(logical_id)?
            }
            ("AWS::Serverless::StateMachine" | "AWS::StepFunctions::StateMachine", "Name") => {
                self.machine_name(logical_id)?
            }
            ("AWS::SNS::Topic", "TopicArn") => self.ref_resource(logical_id)?,
            ("AWS::SNS::Topic", "TopicName") => self
                .property(logical_id, "TopicName")?
                .unwrap_or_else(|| self.default_name(logical_id)),
            ("AWS::Logs::LogGroup", "Arn") => {
                let name = self.ref_resource(logical_id)?;
                self.arn("logs", &format!("log-group:{name}:*"))
            }
            _ => {
                return Err(format!(
                    "Fn::GetAtt {logical_id}.{attribute} ({kind}) is not emulated locally"
                ))
            }
        };
        Ok(value)
    }

    fn reference(&self, name: &str) -> Result<String, String> {
        let stack = &self.stack;
        match name {
            "AWS::StackName" => return Ok(stack.name.clone()),
            "AWS::Region" => return Ok(stack.region.clone()),
            "AWS::AccountId" => return Ok(stack.account.clone()),
            "AWS::Partition" => return Ok(stack.partition.clone()),
            "AWS::URLSuffix" => return Ok("amazonaws.com".to_owned()),
            "AWS::StackId" => {
                return Ok(self.arn("cloudformation", &format!("stack/{}/local", stack.name)))
            }
            "AWS::NoValue" => return Ok(NO_VALUE.to_owned()),
            _ => {}
        }
        if let Some(value) = self.parameters.get(name) {
            return Ok(value.clone());
        }
        if get(self.resources()?, name).is_some() {
            return self.ref_resource(name);
        }
        Err(format!(
            "Ref {name}: no such parameter, pseudo parameter or resource"
        ))
    }

    fn condition(&self, name: &str) -> Result<bool, String> {
        let conditions = as_map(get(&self.root, "Conditions"), "template.yaml Conditions")?;
        let value =
            get(conditions, name).ok_or_else(|| format!("Condition {name} is not declared"))?;
        self.truth(value)
    }

    fn truth(&self, value: &Value) -> Result<bool, String> {
        match self.resolve(value)? {
            Value::Bool(b) => Ok(b),
            Value::String(s) if s == "true" => Ok(true),
            Value::String(s) if s == "false" => Ok(false),
            other => Err(format!("a condition evaluated to {other:?}, not a boolean")),
        }
    }

    fn args<'a>(&self, function: &str, value: &'a Value, n: usize) -> Result<&'a [Value], String> {
        match value {
            Value::Sequence(items) if items.len() == n => Ok(items),
            other => Err(format!(
                "{function}: expected a list of {n} arguments, got {other:?}"
            )),
        }
    }

    fn substitute(
        &self,
        text: &str,
        variables: &BTreeMap<String, String>,
    ) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or_else(|| format!("Fn::Sub {text:?}: unclosed ${{"))?;
            let name = &after[..end];
            if let Some(literal) = name.strip_prefix('!') {
                out.push_str("${");
                out.push_str(literal);
                out.push('}');
            } else if let Some(value) = variables.get(name) {
                out.push_str(value);
            } else if let Some((resource, attribute)) = name.split_once('.') {
                out.push_str(&self.get_att(resource, attribute)?);
            } else {
                out.push_str(&self.reference(name)?);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn intrinsic(&self, function: &str, arg: &Value) -> Result<Value, String> {
        let string = |s: String| Ok(Value::String(s));
        match function {
            "Ref" => {
                let name = scalar(arg).ok_or("Ref: expected a name")?;
                if self.lists.contains(&name) {
                    // As CloudFormation splits it: "" is the list [""], not the empty list.
                    let value = self.reference(&name)?;
                    return Ok(Value::Sequence(
                        value
                            .split(',')
                            .map(|item| Value::String(item.to_owned()))
                            .collect(),
                    ));
                }
                string(self.reference(&name)?)
            }
            "Fn::GetAtt" | "GetAtt" => {
                let (resource, attribute) = match arg {
                    Value::String(s) => s
                        .split_once('.')
                        .map(|(a, b)| (a.to_owned(), b.to_owned()))
                        .ok_or_else(|| format!("Fn::GetAtt {s}: expected Resource.Attribute"))?,
                    Value::Sequence(items) if items.len() == 2 => (
                        self.resolve_string(&items[0])?,
                        self.resolve_string(&items[1])?,
                    ),
                    other => return Err(format!("Fn::GetAtt: unexpected {other:?}")),
                };
                string(self.get_att(&resource, &attribute)?)
            }
            "Fn::Sub" | "Sub" => match arg {
                Value::String(text) => string(self.substitute(text, &BTreeMap::new())?),
                Value::Sequence(items) if items.len() == 2 => {
                    let text =
                        scalar(&items[0]).ok_or("Fn::Sub: the first item is not a string")?;
                    let mut variables = BTreeMap::new();
                    if let Value::Mapping(vars) = &items[1] {
                        for (k, v) in vars {
                            let k = scalar(k).ok_or("Fn::Sub: a variable name is not a string")?;
                            variables.insert(k, self.resolve_string(v)?);
                        }
                    }
                    string(self.substitute(&text, &variables)?)
                }
                other => Err(format!("Fn::Sub: unexpected {other:?}")),
            },
            "Fn::If" | "If" => {
                let items = self.args("Fn::If", arg, 3)?;
                let name = scalar(&items[0]).ok_or("Fn::If: the condition is not a name")?;
                let chosen = if self.condition(&name)? {
                    &items[1]
                } else {
                    &items[2]
                };
                self.resolve(chosen)
            }
            "Fn::Not" | "Not" => {
                let items = self.args("Fn::Not", arg, 1)?;
                Ok(Value::Bool(!self.truth(&items[0])?))
            }
            "Fn::Equals" | "Equals" => {
                let items = self.args("Fn::Equals", arg, 2)?;
                Ok(Value::Bool(
                    self.resolve_string(&items[0])? == self.resolve_string(&items[1])?,
                ))
            }
            "Fn::And" | "And" | "Fn::Or" | "Or" => {
                let Value::Sequence(items) = arg else {
                    return Err(format!("{function}: expected a list"));
                };
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    values.push(self.truth(item)?);
                }
                let all = function.ends_with("And");
                Ok(Value::Bool(if all {
                    values.iter().all(|v| *v)
                } else {
                    values.iter().any(|v| *v)
                }))
            }
            "Condition" => {
                let name = scalar(arg).ok_or("Condition: expected a name")?;
                Ok(Value::Bool(self.condition(&name)?))
            }
            "Fn::Join" | "Join" => {
                let items = self.args("Fn::Join", arg, 2)?;
                let separator = self.resolve_string(&items[0])?;
                let Value::Sequence(parts) = self.resolve(&items[1])? else {
                    return Err("Fn::Join: the second argument is not a list".to_owned());
                };
                let parts: Result<Vec<String>, String> = parts
                    .iter()
                    .map(|p| scalar(p).ok_or_else(|| format!("Fn::Join: {p:?} is not a string")))
                    .collect();
                string(parts?.join(&separator))
            }
            "Fn::Split" | "Split" => {
                let items = self.args("Fn::Split", arg, 2)?;
                let separator = self.resolve_string(&items[0])?;
                if separator.is_empty() {
                    return Err("Fn::Split: the separator is empty".to_owned());
                }
                let text = self.resolve_string(&items[1])?;
                Ok(Value::Sequence(
                    text.split(separator.as_str())
                        .map(|part| Value::String(part.to_owned()))
                        .collect(),
                ))
            }
            "Fn::Select" | "Select" => {
                let items = self.args("Fn::Select", arg, 2)?;
                let index: usize = self
                    .resolve_string(&items[0])?
                    .parse()
                    .map_err(|_| "Fn::Select: the index is not a number".to_owned())?;
                let Value::Sequence(list) = self.resolve(&items[1])? else {
                    return Err("Fn::Select: the second argument is not a list".to_owned());
                };
                list.get(index)
                    .cloned()
                    .ok_or_else(|| format!("Fn::Select: no item {index}"))
            }
            other => Err(format!(
                "intrinsic function {other} is not supported by the local run"
            )),
        }
    }

    /// The value with every intrinsic function evaluated.
    pub fn resolve(&self, value: &Value) -> Result<Value, String> {
        match value {
            Value::Tagged(tagged) => self.intrinsic(&tag_name(&tagged.tag), &tagged.value),
            Value::Mapping(map) => {
                if map.len() == 1 {
                    let (key, arg) = map.iter().next().expect("one entry");
                    if let Some(key) = key.as_str() {
                        if key == "Ref" || key == "Condition" || key.starts_with("Fn::") {
                            return self.intrinsic(key, arg);
                        }
                    }
                }
                let mut out = Mapping::new();
                for (k, v) in map {
                    let v = self.resolve(v)?;
                    if v.as_str() == Some(NO_VALUE) {
                        continue;
                    }
                    out.insert(k.clone(), v);
                }
                Ok(Value::Mapping(out))
            }
            Value::Sequence(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    let v = self.resolve(item)?;
                    if v.as_str() != Some(NO_VALUE) {
                        out.push(v);
                    }
                }
                Ok(Value::Sequence(out))
            }
            other => Ok(other.clone()),
        }
    }

    pub fn resolve_string(&self, value: &Value) -> Result<String, String> {
        let resolved = self.resolve(value)?;
        scalar(&resolved).ok_or_else(|| format!("expected a string, got {resolved:?}"))
    }

    fn resolved_map(&self, value: Option<&Value>) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        if let Some(value) = value {
            let Value::Mapping(map) = self.resolve(value)? else {
                return Err(format!("expected a mapping, got {value:?}"));
            };
            for (k, v) in &map {
                let k = scalar(k).ok_or("a key is not a string")?;
                let v = scalar(v).ok_or_else(|| format!("{k}: {v:?} is not a string"))?;
                out.insert(k, v);
            }
        }
        Ok(out)
    }

    fn globals_function(&self) -> Option<&Mapping> {
        match get(&self.root, "Globals") {
            Some(Value::Mapping(g)) => match get(g, "Function") {
                Some(Value::Mapping(f)) => Some(f),
                _ => None,
            },
            _ => None,
        }
    }

    fn environment_of(props: &Mapping) -> Option<&Value> {
        match get(props, "Environment") {
            Some(Value::Mapping(env)) => get(env, "Variables"),
            _ => None,
        }
    }

    fn number_setting(&self, props: &Mapping, name: &str, default: u32) -> Result<u32, String> {
        let value = get(props, name).or_else(|| self.globals_function().and_then(|g| get(g, name)));
        match value {
            None => Ok(default),
            Some(v) => self
                .resolve_string(v)?
                .parse()
                .map_err(|_| format!("{name} is not a whole number")),
        }
    }

    fn function_plan(&self, logical_id: &str, props: &Mapping) -> Result<FunctionPlan, String> {
        let binary = self.function_binary(logical_id)?;
        let mut environment =
            self.resolved_map(self.globals_function().and_then(Self::environment_of))?;
        environment.extend(self.resolved_map(Self::environment_of(props))?);
        Ok(FunctionPlan {
            logical_id: logical_id.to_owned(),
            arn: self.get_att(logical_id, "Arn")?,
            binary,
            environment,
            memory_mb: self.number_setting(props, "MemorySize", 128)?,
            timeout_seconds: self.number_setting(props, "Timeout", 3)?,
        })
    }

    /// A rule target's `InputTransformer`: `InputPathsMap` (name -> JSON path) and
    /// `InputTemplate`, intrinsics resolved.
    fn input_transformer(&self, value: &Value) -> Result<crate::events::InputTransformer, String> {
        let map = as_map(Some(value), "InputTransformer")?;
        let template = get(map, "InputTemplate")
            .map(|v| self.resolve_string(v))
            .transpose()?
            .ok_or("InputTransformer: no InputTemplate")?;
        Ok(crate::events::InputTransformer {
            paths: self.resolved_map(get(map, "InputPathsMap"))?,
            template,
        })
    }

    fn machine_plan(&self, logical_id: &str, props: &Mapping) -> Result<MachinePlan, String> {
        let uri = get(props, "DefinitionUri")
            .map(|v| self.resolve_string(v))
            .transpose()?
            .ok_or_else(|| {
                format!(
                    "state machine {logical_id}: only DefinitionUri (a local file) is supported"
                )
            })?;
        let path = self.dir.join(&uri);
        let raw = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "state machine {logical_id}: cannot read {}: {e}",
                path.display()
            )
        })?;
        let substitutions = self.resolved_map(get(props, "DefinitionSubstitutions"))?;
        let mut definition = raw;
        for (key, value) in &substitutions {
            definition = definition.replace(&format!("${{{key}}}"), value);
        }
        if let Some(pos) = definition.find("${") {
            let end = definition[pos..]
                .find('}')
                .map_or(definition.len(), |e| pos + e + 1);
            return Err(format!(
                "state machine {logical_id}: {} uses {} which is not in its DefinitionSubstitutions",
                uri,
                &definition[pos..end]
            ));
        }
        serde_json::from_str::<serde_json::Value>(&definition).map_err(|e| {
            format!("state machine {logical_id}: {uri} after substitution is not JSON: {e}")
        })?;
        let mut rules = Vec::new();
        let mut schedules = Vec::new();
        if let Some(Value::Mapping(events)) = get(props, "Events") {
            for (name, event) in events {
                let name = scalar(name).ok_or("an event name is not a string")?;
                let event = as_map(Some(event), &format!("{logical_id} event {name}"))?;
                let kind = get(event, "Type").and_then(scalar).unwrap_or_default();
                let Some(Value::Mapping(event_props)) = get(event, "Properties") else {
                    return Err(format!("{logical_id} event {name}: no Properties"));
                };
                match kind.as_str() {
                    "EventBridgeRule" | "CloudWatchEvent" => {
                        let pattern = get(event_props, "Pattern")
                            .ok_or_else(|| format!("{logical_id} event {name}: no Pattern"))?;
                        let pattern = serde_json::to_value(self.resolve(pattern)?)
                            .map_err(|e| format!("{logical_id} event {name}: {e}"))?;
                        let transformer = get(event_props, "InputTransformer")
                            .map(|t| self.input_transformer(t))
                            .transpose()
                            .map_err(|e| format!("{logical_id} event {name}: {e}"))?;
                        let dead_letter_queue = match get(event_props, "DeadLetterConfig") {
                            None => None,
                            Some(config) => {
                                let config = as_map(Some(config), "DeadLetterConfig")?;
                                let queue = get(config, "Arn")
                                    .or_else(|| get(config, "QueueLogicalId"))
                                    .map(|v| self.resolve_string(v))
                                    .transpose()?;
                                Some(queue.unwrap_or_else(|| format!("{logical_id}{name}Queue")))
                            }
                        };
                        rules.push(RulePlan {
                            name,
                            pattern,
                            transformer,
                            dead_letter_queue,
                        });
                    }
                    "Schedule" | "ScheduleV2" => {
                        let expression = get(event_props, "Schedule")
                            .or_else(|| get(event_props, "ScheduleExpression"))
                            .map(|v| self.resolve_string(v))
                            .transpose()?
                            .ok_or_else(|| format!("{logical_id} event {name}: no Schedule"))?;
                        let input = get(event_props, "Input")
                            .map(|v| self.resolve_string(v))
                            .transpose()?
                            .unwrap_or_else(|| "{}".to_owned());
                        schedules.push(SchedulePlan {
                            name,
                            period: rate_period(&expression),
                            expression,
                            input,
                        });
                    }
                    other => {
                        return Err(format!(
                            "{logical_id} event {name}: event type {other} is not emulated locally"
                        ))
                    }
                }
            }
        }
        Ok(MachinePlan {
            logical_id: logical_id.to_owned(),
            name: self.machine_name(logical_id)?,
            arn: self.ref_resource(logical_id)?,
            definition_uri: uri,
            definition,
            substitutions,
            machine_type: self
                .property(logical_id, "Type")?
                .unwrap_or_else(|| "STANDARD".to_owned()),
            rules,
            schedules,
        })
    }

    pub fn plan(&self) -> Result<Plan, String> {
        let mut tables = Vec::new();
        let mut topics = Vec::new();
        let mut functions = Vec::new();
        let mut machines = Vec::new();
        let mut skipped = Vec::new();
        for (id, resource) in self.resources()? {
            let id = scalar(id).ok_or("a resource id is not a string")?;
            let resource = as_map(Some(resource), &format!("resource {id}"))?;
            if let Some(Value::String(condition)) = get(resource, "Condition") {
                if !self.condition(condition)? {
                    continue;
                }
            }
            let kind = self.resource_type(&id)?;
            let empty = Mapping::new();
            let props = match get(resource, "Properties") {
                Some(Value::Mapping(p)) => p,
                _ => &empty,
            };
            match kind.as_str() {
                "AWS::DynamoDB::Table" => {
                    let pairs =
                        |key: &str, a: &str, b: &str| -> Result<Vec<(String, String)>, String> {
                            let Some(Value::Sequence(items)) = get(props, key) else {
                                return Err(format!("table {id}: no {key}"));
                            };
                            items
                                .iter()
                                .map(|item| {
                                    let item = as_map(Some(item), key)?;
                                    let first =
                                        get(item, a).map(|v| self.resolve_string(v)).transpose()?;
                                    let second =
                                        get(item, b).map(|v| self.resolve_string(v)).transpose()?;
                                    first.zip(second).ok_or_else(|| {
                                        format!("table {id}: {key} needs {a} and {b}")
                                    })
                                })
                                .collect()
                        };
                    tables.push(TablePlan {
                        logical_id: id.clone(),
                        name: self.ref_resource(&id)?,
                        attributes: pairs(
                            "AttributeDefinitions",
                            "AttributeName",
                            "AttributeType",
                        )?,
                        key_schema: pairs("KeySchema", "AttributeName", "KeyType")?,
                        billing_mode: self
                            .property(&id, "BillingMode")?
                            .unwrap_or_else(|| "PROVISIONED".to_owned()),
                    });
                }
                "AWS::SNS::Topic" => {
                    let arn = self.ref_resource(&id)?;
                    let name = arn.rsplit(':').next().unwrap_or_default().to_owned();
                    topics.push(TopicPlan {
                        logical_id: id.clone(),
                        name,
                        arn,
                    });
                }
                "AWS::Serverless::Function" => functions.push(self.function_plan(&id, props)?),
                "AWS::Serverless::StateMachine" => machines.push(self.machine_plan(&id, props)?),
                _ => skipped.push((id.clone(), kind)),
            }
        }
        // The semaphore table is the one every function gets as TABLE_NAME (or the only one).
        let semaphore_table = functions
            .first()
            .and_then(|f: &FunctionPlan| f.environment.get("TABLE_NAME"));
        let at = match semaphore_table {
            Some(name) => tables
                .iter()
                .position(|t: &TablePlan| t.name == *name)
                .ok_or_else(|| format!("TABLE_NAME {name} is no table of template.yaml"))?,
            None if tables.len() == 1 => 0,
            None => {
                return Err("template.yaml has no table, or several and no TABLE_NAME".to_owned())
            }
        };
        let table = tables.remove(at);
        Ok(Plan {
            stack: self.stack.clone(),
            parameters: self.parameters.clone(),
            table,
            other_tables: tables,
            topics,
            functions,
            machines,
            skipped,
        })
    }
}

/// The period of `rate(N unit)`.
pub fn rate_period(expression: &str) -> Option<Duration> {
    let inner = expression.trim().strip_prefix("rate(")?.strip_suffix(')')?;
    let (n, unit) = inner.trim().split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let seconds = match unit.trim() {
        "minute" | "minutes" => 60,
        "hour" | "hours" => 3_600,
        "day" | "days" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n * seconds))
}

/// Does `event` match the EventBridge `pattern`? Supports what rule patterns of this kind use:
/// nested objects, and lists of exact values (strings, numbers, booleans, null).
pub fn matches(pattern: &serde_json::Value, event: &serde_json::Value) -> bool {
    use serde_json::Value as J;
    match pattern {
        J::Object(fields) => fields.iter().all(|(key, want)| {
            let got = event.get(key).unwrap_or(&J::Null);
            match want {
                J::Object(_) => matches(want, got),
                J::Array(options) => options.iter().any(|o| match got {
                    J::Array(items) => items.contains(o),
                    single => single == o,
                }),
                exact => got == exact,
            }
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_template() -> Template {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        Template::load(&root, Stack::default(), &BTreeMap::new()).expect("template.yaml loads")
    }

    /// A parameter's bound in template.yaml, e.g. `MinValue` of `QueueFallbackSeconds`.
    fn parameter_bound(name: &str, bound: &str) -> u64 {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        let root: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(path).expect("read template.yaml"))
                .expect("template.yaml is YAML");
        root["Parameters"][name][bound]
            .as_u64()
            .unwrap_or_else(|| panic!("template.yaml: {name} has no whole {bound}"))
    }

    #[test]
    fn the_fallback_bounds_are_the_acquire_functions_and_above_its_timeout() {
        let plan = repo_template().plan().expect("plan");
        let timeout = u64::from(plan.function("acquire").unwrap().timeout_seconds);
        // The function's own check and the template's bound are the same numbers...
        assert_eq!(
            timeout,
            lambda_common::ACQUIRE_FUNCTION_TIMEOUT.as_secs(),
            "the acquire function's Timeout in template.yaml is not lambda_common::ACQUIRE_FUNCTION_TIMEOUT"
        );
        let min = parameter_bound("QueueFallbackSeconds", "MinValue");
        let max = parameter_bound("QueueFallbackSeconds", "MaxValue");
        assert_eq!(min..=max, lambda_common::QUEUE_FALLBACK_RANGE);
        // ...and a fallback check never starts while the previous invocation may still run.
        assert!(
            min > timeout,
            "QueueFallbackSeconds MinValue {min} <= Timeout {timeout}"
        );
        let wait = (
            parameter_bound("MaxWaitSeconds", "MinValue"),
            parameter_bound("MaxWaitSeconds", "MaxValue"),
        );
        assert_eq!(
            wait.0..=wait.1,
            lambda_common::MAX_WAIT_RANGE,
            "MaxWaitSeconds' bounds are the function's"
        );
    }

    #[test]
    fn intrinsics_resolve_in_short_and_long_form() {
        let text = r#"
Parameters:
  Limit: {Type: Number, Default: 5}
  Empty: {Type: String, Default: ""}
Conditions:
  HasEmpty: !Not [!Equals [!Ref Empty, ""]]
Resources:
  T:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: lock, AttributeType: S}]
      KeySchema: [{AttributeName: lock, KeyType: HASH}]
  F:
    Type: AWS::Serverless::Function
    Metadata: {BuildProperties: {Binary: acquire}}
    Properties:
      Environment:
        Variables:
          A: !Ref T
          B: !GetAtt T.Arn
          C: !Sub "${AWS::StackName}-x-${Limit}-${!Keep}"
          D: !If [HasEmpty, yes, "no"]
          E: {"Fn::Sub": ["${X}/${T.Arn}", {X: !Ref Limit}]}
          G: {"Fn::GetAtt": [F, Arn]}
          H: !Join ["-", [a, !Ref Limit]]
          I: !If [HasEmpty, x, !Ref AWS::NoValue]
"#;
        let mut overrides = BTreeMap::new();
        overrides.insert("Limit".to_owned(), "3".to_owned());
        let t = Template::parse(text, PathBuf::from("."), Stack::default(), &overrides).unwrap();
        let plan = t.plan().unwrap();
        let env = &plan.functions[0].environment;
        assert_eq!(env["A"], "semaphore-local-T");
        assert_eq!(
            env["B"],
            "arn:aws:dynamodb:us-east-1:123456789012:table/semaphore-local-T"
        );
        assert_eq!(env["C"], "semaphore-local-x-3-${Keep}");
        assert_eq!(env["D"], "no");
        assert_eq!(
            env["E"],
            "3/arn:aws:dynamodb:us-east-1:123456789012:table/semaphore-local-T"
        );
        assert_eq!(
            env["G"],
            "arn:aws:lambda:us-east-1:123456789012:function:acquire"
        );
        assert_eq!(env["H"], "a-3");
        assert!(!env.contains_key("I"));
        assert_eq!(
            plan.table.key_schema,
            [("lock".to_owned(), "HASH".to_owned())]
        );
        let unknown = Template::parse(
            "Parameters: {}\nResources: {}\n",
            PathBuf::from("."),
            Stack::default(),
            &overrides,
        );
        assert!(
            unknown.is_err(),
            "an override of an undeclared parameter is refused"
        );
    }

    #[test]
    fn the_repository_template_plans_every_machine_with_its_substitutions() {
        let plan = repo_template().plan().expect("plan");
        assert_eq!(
            plan.table.key_schema,
            [("lock".to_owned(), "HASH".to_owned())]
        );
        assert_eq!(plan.table.billing_mode, "PAY_PER_REQUEST");
        let binaries: Vec<&str> = plan.functions.iter().map(|f| f.binary.as_str()).collect();
        for binary in ["acquire", "release", "cleanup", "sweeper"] {
            assert!(binaries.contains(&binary), "{binaries:?}");
        }
        let table = &plan.table.name;
        // Every function gets the protocol's timing from the template's two parameters (the
        // fence window is computed from them; there is no window parameter to get wrong).
        assert_eq!(plan.timing_seconds(), Ok((8, 2)));
        for f in &plan.functions {
            assert_eq!(&f.environment["TABLE_NAME"], table, "{}", f.binary);
            assert_eq!(
                f.environment["ACQUIRE_HORIZON_SECONDS"], "8",
                "{}",
                f.binary
            );
            assert_eq!(f.environment["CLOCK_SKEW_SECONDS"], "2", "{}", f.binary);
            assert!(
                !f.environment.contains_key("FENCE_WINDOW_SECONDS"),
                "{}",
                f.binary
            );
        }
        let lock = plan.parameters["LockName"].clone();
        let protected = plan.machine("LockProtectedStateMachine").unwrap();
        let demo = plan.machine("DemoWorkStateMachine").unwrap();
        let runner = plan.machine("WorkFunctionStateMachine").unwrap();
        assert_eq!(
            demo.arn,
            "arn:aws:states:us-east-1:123456789012:stateMachine:semaphore-local-demo-work"
        );
        for f in &plan.functions {
            // Every function resolves an execution's lock alike; none has a list of locks.
            assert_eq!(f.environment["DEFAULT_LOCK"], lock, "{}", f.binary);
            assert!(!f.environment.contains_key("LOCK_NAMES"), "{}", f.binary);
        }
        let acquire = &plan.function("acquire").unwrap().environment;
        assert_eq!(acquire["DEFAULT_LIMIT"], "5");
        assert_eq!(acquire["MAX_WAIT_SECONDS"], "86400");
        assert_eq!(acquire["QUEUE_FALLBACK_SECONDS"], "300");
        // The waiters' table is deployed too, and every function knows it.
        assert_eq!(plan.other_tables.len(), 1);
        let queue = &plan.other_tables[0];
        assert_eq!(
            queue.key_schema,
            [
                ("lock".to_owned(), "HASH".to_owned()),
                ("place".to_owned(), "RANGE".to_owned())
            ]
        );
        for f in &plan.functions {
            assert_eq!(
                f.environment["QUEUE_TABLE_NAME"], queue.name,
                "{}",
                f.binary
            );
        }
        assert_eq!(acquire["DEFAULT_WORK"], demo.arn);
        // The default lists are empty: the demo work only, no function.
        assert_eq!(acquire["WORK_STATE_MACHINES"], demo.arn);
        assert_eq!(acquire["WORK_FUNCTIONS"], "");
        assert_eq!(acquire["WORK_FUNCTION_RUNNER"], runner.arn);
        let cleanup = &plan.function("cleanup").unwrap().environment;
        assert_eq!(
            cleanup["ACQUIRE_FUNCTION_ARN"],
            plan.function("acquire").unwrap().arn
        );
        assert_eq!(cleanup["WORK_FUNCTION_RUNNER"], runner.arn);
        let sweeper = &plan.function("sweeper").unwrap().environment;
        assert_eq!(sweeper["TOPIC_ARN"], plan.topics[0].arn);
        let example = plan.machine("YourWorkflowExampleStateMachine").unwrap();
        assert_eq!(
            sweeper["STATE_MACHINE_ARNS"],
            format!("{},{}", protected.arn, example.arn)
        );
        assert!(protected
            .definition
            .contains("arn:aws:lambda:us-east-1:123456789012:function:acquire"));
        assert!(!protected.definition.contains("${"));
        // The acquire's request time is its state's entry time.
        let definition: serde_json::Value = serde_json::from_str(&protected.definition).unwrap();
        assert_eq!(
            definition["States"]["Acquire slot"]["Parameters"]["Payload"]["requested_at.$"],
            "$$.State.EnteredTime"
        );
        let (cleanup, rule) = plan.rule_target().unwrap();
        assert_eq!(cleanup.logical_id, "CleanupStateMachine");
        assert_eq!(
            rule.pattern["detail"]["stateMachineArn"],
            serde_json::json!([protected.arn, example.arn])
        );
        let (sweep, schedule) = plan.scheduled().unwrap();
        assert_eq!(sweep.logical_id, "SweeperStateMachine");
        assert_eq!(schedule.period, Some(Duration::from_secs(300)));
        assert_eq!(plan.machines.len(), 7);
    }

    #[test]
    fn list_parameters_reach_the_environment_and_the_rule() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        let mine = "arn:aws:states:us-east-1:123456789012:stateMachine:mine";
        let overrides = BTreeMap::from([
            (
                "WorkStateMachineArns".to_owned(),
                format!("{mine},{mine}-too"),
            ),
            (
                "WorkFunctionArns".to_owned(),
                "arn:aws:lambda:us-east-1:123456789012:function:work".to_owned(),
            ),
            ("ProtectedStateMachineArns".to_owned(), mine.to_owned()),
        ]);
        let plan = Template::load(&root, Stack::default(), &overrides)
            .and_then(|t| t.plan())
            .expect("plan");
        let demo = plan.machine("DemoWorkStateMachine").unwrap().arn.clone();
        let acquire = &plan.function("acquire").unwrap().environment;
        assert_eq!(
            acquire["WORK_STATE_MACHINES"],
            format!("{demo},{mine},{mine}-too")
        );
        assert_eq!(
            acquire["WORK_FUNCTIONS"],
            "arn:aws:lambda:us-east-1:123456789012:function:work"
        );
        let protected = plan.machine("LockProtectedStateMachine").unwrap();
        let example = plan.machine("YourWorkflowExampleStateMachine").unwrap();
        let (_, rule) = plan.rule_target().unwrap();
        assert_eq!(
            rule.pattern["detail"]["stateMachineArn"],
            serde_json::json!([protected.arn, example.arn, mine])
        );
        assert_eq!(
            plan.function("sweeper").unwrap().environment["STATE_MACHINE_ARNS"],
            format!("{},{},{mine}", protected.arn, example.arn)
        );
    }

    #[test]
    fn split_and_list_refs_resolve_as_cloudformation_does() {
        let text = r#"
Parameters:
  Machines: {Type: CommaDelimitedList, Default: ""}
Conditions:
  HasMachines: !Not [!Equals [!Join ["", !Ref Machines], ""]]
Resources:
  T:
    Type: AWS::DynamoDB::Table
    Properties:
      AttributeDefinitions: [{AttributeName: lock, AttributeType: S}]
      KeySchema: [{AttributeName: lock, KeyType: HASH}]
  F:
    Type: AWS::Serverless::Function
    Metadata: {BuildProperties: {Binary: acquire}}
    Properties:
      Environment:
        Variables:
          A: !If [HasMachines, !Join [";", !Split [",", !Join [",", !Ref Machines]]], none]
          B: !Join
            - ","
            - !Split
              - ","
              - !Join
                - ":execution:"
                - !Split
                  - ":stateMachine:"
                  - !Join ["", [!Join [":*,", !Ref Machines], ":*"]]
"#;
        let plan = |machines: Option<&str>| {
            let overrides: BTreeMap<String, String> = machines
                .map(|m| BTreeMap::from([("Machines".to_owned(), m.to_owned())]))
                .unwrap_or_default();
            Template::parse(text, PathBuf::from("."), Stack::default(), &overrides)
                .and_then(|t| t.plan())
                .expect("plan")
                .functions[0]
                .environment
                .clone()
        };
        assert_eq!(plan(None)["A"], "none");
        let env = plan(Some("arn:s:stateMachine:a,arn:s:stateMachine:b"));
        assert_eq!(env["A"], "arn:s:stateMachine:a;arn:s:stateMachine:b");
        // The template's execution-ARN patterns, built from machine ARNs.
        assert_eq!(env["B"], "arn:s:execution:a:*,arn:s:execution:b:*");
    }

    #[test]
    fn rule_patterns_match_like_eventbridge() {
        let pattern = serde_json::json!({
            "source": ["aws.states"],
            "detail": {"status": ["FAILED", "ABORTED"], "stateMachineArn": ["m"]}
        });
        let event = |status: &str, machine: &str| serde_json::json!({"source": "aws.states", "detail": {"status": status, "stateMachineArn": machine}});
        assert!(matches(&pattern, &event("FAILED", "m")));
        assert!(matches(&pattern, &event("ABORTED", "m")));
        assert!(!matches(&pattern, &event("SUCCEEDED", "m")));
        assert!(!matches(&pattern, &event("FAILED", "other")));
    }

    #[test]
    fn rates_parse() {
        assert_eq!(
            rate_period("rate(5 minutes)"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(rate_period("rate(1 hour)"), Some(Duration::from_secs(3600)));
        assert_eq!(rate_period("cron(0/10 * * * ? *)"), None);
    }
}
