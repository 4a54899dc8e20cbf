//! CloudFormation's deploy-time rules, made to happen by the local server
//! (`local/moto_server.py`, `patch_deploy_time_rules`; the sources in docs/aws-limits.md): each
//! test deploys a small template broken for one rule through `local/deploy_stack.py`, as the
//! local run deploys template.yaml, and asserts the named refusal (the rule, the output or
//! resource, and the fix) and a failed deploy; the controls deploy the same template within
//! the rule (at the quota where it is cheap), so a refusal is the rule's and nothing else's.
//! F16: moto enforced none of these, and the first `sam deploy` failed on an empty export.
//! A template's `Rules` are evaluated too, through the SAM transform (which keeps them), on the
//! parameters as resolved: a false assertion refuses the deploy with its AssertDescription
//! before anything exists, a rule function the local server does not evaluate by name.
//!
//! Needs the repository's `.venv` (`bash tests/run.sh` makes it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use local_aws::sfn::unique;
use local_aws::stack::{deploy_template, Stack};
use local_aws::Error;
use serde_json::{json, Map, Value};

fn python() -> PathBuf {
    std::env::var_os("SEMAPHORE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| local_aws::server::repo_root().join(".venv/bin/python"))
}

/// A SAM template that deploys: one function and one state machine (what deploy_stack.py
/// checks a stack has), as small as the SAM transform makes them (four resources: each with
/// its role).
fn template() -> Value {
    json!({
        "AWSTemplateFormatVersion": "2010-09-09",
        "Transform": "AWS::Serverless-2016-10-31",
        "Parameters": {},
        "Resources": {
            "Probe": {
                "Type": "AWS::Serverless::Function",
                "Properties": {"Runtime": "provided.al2023", "Handler": "bootstrap"},
                "Metadata": {"BuildProperties": {"Binary": "probe"}}
            },
            "ProbeMachine": {
                "Type": "AWS::Serverless::StateMachine",
                "Properties": {
                    "Definition": {"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}
                }
            }
        },
        "Outputs": {}
    })
}

/// The resources the SAM transform makes of [`template`].
const TEMPLATE_RESOURCES: usize = 4;

/// The template's section `name` (Outputs, Parameters...), made empty if it has none.
fn section<'a>(template: &'a mut Value, name: &str) -> &'a mut Map<String, Value> {
    template
        .as_object_mut()
        .and_then(|t| t.entry(name).or_insert_with(|| json!({})).as_object_mut())
        .unwrap_or_else(|| panic!("the template's {name} is not an object"))
}

/// An SSM parameter of the stack holding `value` (moto 5.2.5 cannot name one itself).
fn ssm_parameter(value: Value) -> Value {
    json!({"Type": "AWS::SSM::Parameter", "Properties": {
        "Name": {"Fn::Sub": "/rules/${AWS::StackName}/prefix"}, "Type": "String", "Value": value}})
}

/// `template` deployed through deploy_stack.py as a stack of its own (`stack`, or a unique
/// name): the stack's description, or deploy_stack.py's error (its stderr).
fn deploy_as(stack: &str, template: &Value, parameters: &[(&str, &str)]) -> Result<Value, String> {
    let path = std::env::temp_dir().join(format!("{stack}.template.json"));
    std::fs::write(&path, template.to_string()).expect("write the template");
    let parameters: BTreeMap<String, String> = parameters
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let deployed = deploy_template(
        &python(),
        &local_aws::server::repo_root(),
        &path,
        local_aws::endpoint(),
        &Stack {
            name: stack.to_owned(),
            ..Stack::default()
        },
        &parameters,
        &BTreeMap::new(),
    );
    let _ = std::fs::remove_file(&path);
    match deployed {
        Ok(stdout) => Ok(serde_json::from_slice(&stdout).expect("a stack description")),
        Err(Error::Deploy { stderr, .. }) => Err(stderr),
        Err(other) => panic!("deploy_stack.py did not run: {other}"),
    }
}

fn deploy(template: &Value, parameters: &[(&str, &str)]) -> Result<Value, String> {
    deploy_as(&unique("rules"), template, parameters)
}

/// Asserts that deploying `template` fails naming `rule` and `naming`, with a fix.
fn refused(template: &Value, parameters: &[(&str, &str)], rule: &str, naming: &str) -> String {
    let error = match deploy(template, parameters) {
        Ok(_) => panic!("deployed, where CloudFormation refuses: {rule}"),
        Err(error) => error,
    };
    for expected in [rule, naming, "Fix: "] {
        assert!(
            error.contains(expected),
            "the refusal does not say {expected:?}:\n{error}"
        );
    }
    error
}

/// An output of `value` exported as `name`.
fn exported(value: Value, name: Value) -> Value {
    json!({"Value": value, "Export": {"Name": name}})
}

fn with_output(key: &str, output: Value) -> Value {
    let mut template = template();
    section(&mut template, "Outputs").insert(key.to_owned(), output);
    template
}

#[test]
fn a_template_that_breaks_no_rule_deploys_and_exports() {
    let mut template = with_output(
        "Prefix",
        exported(
            json!({"Ref": "Prefix"}),
            json!({"Fn::Sub": "${AWS::StackName}-Prefix"}),
        ),
    );
    section(&mut template, "Parameters").insert("Prefix".into(), json!({"Type": "String"}));
    section(&mut template, "Resources").insert(
        "PrefixParameter".into(),
        ssm_parameter(json!({"Ref": "Prefix"})),
    );
    // A number exports as its text, as CloudFormation resolves it.
    section(&mut template, "Parameters")
        .insert("Limit".into(), json!({"Type": "Number", "Default": 5}));
    section(&mut template, "Outputs").insert(
        "Limit".into(),
        exported(
            json!({"Ref": "Limit"}),
            json!({"Fn::Sub": "${AWS::StackName}-Limit"}),
        ),
    );
    let stack = deploy(&template, &[("Prefix", "team-")]).expect("deploys");
    let name = stack["stack"]["name"].as_str().unwrap();
    assert_eq!(
        stack["outputs"]["Prefix"],
        json!({"value": "team-", "export": format!("{name}-Prefix")})
    );
    assert_eq!(stack["outputs"]["Limit"]["export"], format!("{name}-Limit"));
}

#[test]
fn an_exported_value_that_is_empty_or_whitespace_is_rolled_back() {
    // The shipped template's first `sam deploy`: an output exporting !Ref of a parameter
    // whose default is empty. The rule holds for the value as resolved, not as written.
    let mut template = with_output(
        "Prefix",
        exported(
            json!({"Ref": "Prefix"}),
            json!({"Fn::Sub": "${AWS::StackName}-Prefix"}),
        ),
    );
    section(&mut template, "Parameters")
        .insert("Prefix".into(), json!({"Type": "String", "Default": ""}));
    for value in ["", "  "] {
        let error = refused(
            &template,
            &[("Prefix", value)],
            "Exported values must not be empty or whitespace-only",
            "output Prefix",
        );
        assert!(error.contains("rolled stack"), "not a rollback: {error}");
    }
    // Exported only when its condition holds, an empty value exports nothing, as on AWS.
    template["Conditions"] =
        json!({"HasPrefix": {"Fn::Not": [{"Fn::Equals": [{"Ref": "Prefix"}, ""]}]}});
    template["Outputs"]["Prefix"]["Condition"] = json!("HasPrefix");
    let stack = deploy(&template, &[]).expect("an output under a false condition exports nothing");
    assert_eq!(stack["outputs"], json!({}));
}

#[test]
fn an_exported_value_over_1024_characters_is_rolled_back() {
    let long = "v".repeat(1025);
    refused(
        &with_output(
            "Long",
            exported(json!(long), json!({"Fn::Sub": "${AWS::StackName}-Long"})),
        ),
        &[],
        "Cannot export output Long with length 1025. Max length of 1024 exceeded.",
        "output Long",
    );
    let at_most = "v".repeat(1024);
    deploy(
        &with_output(
            "Long",
            exported(json!(at_most), json!({"Fn::Sub": "${AWS::StackName}-Long"})),
        ),
        &[],
    )
    .expect("1,024 characters export");
}

#[test]
fn an_export_name_of_other_characters_or_too_long_is_refused() {
    for name in ["${AWS::StackName}_prefix", "${AWS::StackName}.prefix"] {
        refused(
            &with_output("Prefix", exported(json!("team-"), json!({"Fn::Sub": name}))),
            &[],
            "consist only of alphanumeric characters, colons, or hyphens",
            "Output Prefix",
        );
    }
    let long = format!("${{AWS::StackName}}:{}", "n".repeat(256));
    refused(
        &with_output("Prefix", exported(json!("team-"), json!({"Fn::Sub": long}))),
        &[],
        "must not be longer than 256 characters",
        "Output Prefix",
    );
    deploy(
        &with_output(
            "Prefix",
            exported(
                json!("team-"),
                json!({"Fn::Sub": "${AWS::StackName}:Prefix-1"}),
            ),
        ),
        &[],
    )
    .expect("letters, digits, colons and hyphens export");
}

#[test]
fn an_export_name_exported_twice_in_the_region_is_refused() {
    let shared = unique("shared-export");
    let mut twice = with_output("First", exported(json!("a"), json!(shared)));
    section(&mut twice, "Outputs").insert("Second".into(), exported(json!("b"), json!(shared)));
    refused(
        &twice,
        &[],
        &format!("Export with name {shared} is already exported by this stack's output First"),
        "output Second",
    );
    // Once by a stack of its own, then by another: the second is rolled back, naming the first.
    let first = unique("rules-first");
    deploy_as(
        &first,
        &with_output("First", exported(json!("a"), json!(shared))),
        &[],
    )
    .expect("the first export of the name");
    let error = refused(
        &with_output("Again", exported(json!("b"), json!(shared))),
        &[],
        &format!("Export with name {shared} is already exported by stack {first}"),
        "output Again",
    );
    assert!(error.contains("rolled stack"), "not a rollback: {error}");
}

/// A template with `count` entries in `name` (outputs, parameters or mappings).
fn with_many(name: &str, count: usize) -> Value {
    let mut template = template();
    let entries = section(&mut template, name);
    for i in 0..count {
        let entry = match name {
            "Outputs" => json!({"Value": format!("v{i}")}),
            "Parameters" => json!({"Type": "String", "Default": "p"}),
            "Mappings" => json!({"Key": {"Attribute": "v"}}),
            _ => unreachable!("{name}"),
        };
        entries.insert(format!("{}{i}", &name[..name.len() - 1]), entry);
    }
    template
}

#[test]
fn more_outputs_than_cloudformation_allows_are_refused() {
    refused(
        &with_many("Outputs", 201),
        &[],
        "Number of outputs, 201, is greater than maximum allowed, 200",
        "outputs",
    );
    deploy(&with_many("Outputs", 200), &[]).expect("200 outputs deploy");
}

#[test]
fn more_parameters_than_cloudformation_allows_are_refused() {
    refused(
        &with_many("Parameters", 201),
        &[],
        "Number of parameters, 201, is greater than maximum allowed, 200",
        "parameters",
    );
    deploy(&with_many("Parameters", 200), &[]).expect("200 parameters deploy");
}

#[test]
fn more_mappings_or_mapping_attributes_than_cloudformation_allows_are_refused() {
    refused(
        &with_many("Mappings", 201),
        &[],
        "Number of mappings, 201, is greater than maximum allowed, 200",
        "mappings",
    );
    deploy(&with_many("Mappings", 200), &[]).expect("200 mappings deploy");
    let mut template = template();
    let attributes: Map<String, Value> = (0..201).map(|i| (format!("A{i}"), json!("v"))).collect();
    template["Mappings"] = json!({"Wide": {"Key": attributes}});
    refused(
        &template,
        &[],
        "Mapping Wide key Key has 201 attributes, more than the maximum allowed, 200",
        "Wide",
    );
}

#[test]
fn more_resources_than_cloudformation_allows_after_the_transform_are_refused() {
    // Counted after the SAM transform: the template's two resources are four.
    let with_handles = |count: usize| {
        let mut template = template();
        let resources = section(&mut template, "Resources");
        for i in 0..count {
            resources.insert(
                format!("Handle{i}"),
                json!({"Type": "AWS::CloudFormation::WaitConditionHandle"}),
            );
        }
        template
    };
    refused(
        &with_handles(500 - TEMPLATE_RESOURCES + 1),
        &[],
        "Number of resources, 501, is greater than maximum allowed, 500",
        "resources",
    );
    deploy(&with_handles(500 - TEMPLATE_RESOURCES), &[]).expect("500 resources deploy");
}

#[test]
fn a_template_over_what_sam_deploy_can_upload_is_refused() {
    // `sam deploy` (resolve_s3) uploads the template to S3: 1 MB, the translated template.
    let mut template = template();
    template["Metadata"] = json!({"Padding": "p".repeat(1_000_000)});
    refused(
        &template,
        &[],
        "Template may not exceed 1000000 bytes in size",
        ".template.json",
    );
}

fn with_ssm_value(value: &str, tier: Option<&str>) -> Value {
    let mut template = template();
    let mut parameter = ssm_parameter(json!(value));
    if let Some(tier) = tier {
        parameter["Properties"]["Tier"] = json!(tier);
    }
    section(&mut template, "Resources").insert("PrefixParameter".into(), parameter);
    template
}

#[test]
fn an_ssm_parameter_with_an_empty_value_is_rolled_back() {
    let error = refused(
        &with_ssm_value("", None),
        &[],
        "Member must have length greater than or equal to 1",
        "PrefixParameter",
    );
    assert!(error.contains("rolled stack"), "not a rollback: {error}");
}

#[test]
fn an_ssm_parameter_over_its_tiers_size_is_rolled_back() {
    refused(
        &with_ssm_value(&"v".repeat(4097), None),
        &[],
        "Standard tier parameters support a maximum parameter value of 4096 characters",
        "PrefixParameter",
    );
    deploy(&with_ssm_value(&"v".repeat(4096), None), &[]).expect("4,096 characters deploy");
    deploy(&with_ssm_value(&"v".repeat(8192), Some("Advanced")), &[])
        .expect("8 KB deploy in the advanced tier");
}

/// UpdateStack of `stack` to `template` (CloudFormation's own, no transform), sent by boto3 as
/// `sam deploy` sends an update: CloudFormation's refusal, or None when it took the update.
fn update(stack: &str, template: &Value) -> Option<String> {
    update_with(stack, template, &[])
}

/// [`update`] with `parameters` (key, value) in the request.
fn update_with(stack: &str, template: &Value, parameters: &[(&str, &str)]) -> Option<String> {
    let path = std::env::temp_dir().join(format!("{stack}.update.json"));
    std::fs::write(&path, template.to_string()).expect("write the template");
    let parameters: Vec<Value> = parameters
        .iter()
        .map(|(k, v)| json!({"ParameterKey": k, "ParameterValue": v}))
        .collect();
    let script = "import sys, json, boto3, botocore.exceptions\n\
        cfn = boto3.client('cloudformation', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                           aws_access_key_id='testing', aws_secret_access_key='testing')\n\
        try:\n\
        \x20   cfn.update_stack(StackName=sys.argv[2], TemplateBody=open(sys.argv[3]).read(),\n\
        \x20                    Parameters=json.loads(sys.argv[4]), Capabilities=['CAPABILITY_IAM'])\n\
        except botocore.exceptions.ClientError as error:\n\
        \x20   print(error.response['Error']['Message'])\n";
    let output = std::process::Command::new(python())
        .args(["-c", script, local_aws::endpoint(), stack])
        .arg(&path)
        .arg(Value::from(parameters).to_string())
        .output()
        .expect("run python");
    let _ = std::fs::remove_file(&path);
    assert!(output.status.success(), "{output:?}");
    let refusal = String::from_utf8(output.stdout).expect("UTF-8");
    (!refusal.trim().is_empty()).then(|| refusal.trim().to_owned())
}

#[test]
fn an_update_over_a_quota_or_with_an_empty_ssm_value_is_refused() {
    let stack = unique("rules-update");
    deploy_as(&stack, &template(), &[]).expect("the stack to update");
    let plain = |outputs: usize, ssm_value: &str| {
        let outputs: Map<String, Value> = (0..outputs)
            .map(|i| (format!("Output{i}"), json!({"Value": format!("v{i}")})))
            .collect();
        json!({"Resources": {"PrefixParameter": ssm_parameter(json!(ssm_value))}, "Outputs": outputs})
    };
    assert_eq!(
        update(&stack, &plain(200, "team-")),
        None,
        "an update within the rules"
    );
    let refusal = update(&stack, &plain(201, "team-")).expect("201 outputs refused");
    assert!(
        refusal.contains("Number of outputs, 201, is greater than maximum allowed, 200")
            && refusal.contains("Fix: "),
        "{refusal}"
    );
    let refusal = update(&stack, &plain(1, "")).expect("an empty SSM value refused");
    assert!(
        refusal.contains("Member must have length greater than or equal to 1")
            && refusal.contains("Fix: "),
        "{refusal}"
    );
}

/// The status of stack `name` (DescribeStacks), or None when there is no such stack.
fn stack_status(name: &str) -> Option<String> {
    let script = "import sys, boto3, botocore.exceptions\n\
        cfn = boto3.client('cloudformation', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                           aws_access_key_id='testing', aws_secret_access_key='testing')\n\
        try:\n\
        \x20   print(cfn.describe_stacks(StackName=sys.argv[2])['Stacks'][0]['StackStatus'])\n\
        except botocore.exceptions.ClientError as error:\n\
        \x20   assert 'does not exist' in error.response['Error']['Message'], error\n";
    let output = std::process::Command::new(python())
        .args(["-c", script, local_aws::endpoint(), name])
        .output()
        .expect("run python");
    assert!(output.status.success(), "{output:?}");
    let status = String::from_utf8(output.stdout).expect("UTF-8");
    (!status.trim().is_empty()).then(|| status.trim().to_owned())
}

/// What a test environment may take, by a rule (the Rules syntax page's example, reworded).
const SIZE_RULE: &str = "A test environment takes a small or medium instance size.";

/// [`template`] with the parameters Environment (default test) and Size (default large) and
/// the rule that a test environment takes a small or medium size: its defaults break it.
fn with_size_rule() -> Value {
    let mut template = template();
    let parameters = section(&mut template, "Parameters");
    parameters.insert(
        "Environment".into(),
        json!({"Type": "String", "Default": "test"}),
    );
    parameters.insert("Size".into(), json!({"Type": "String", "Default": "large"}));
    template["Rules"] = json!({"TestSizes": {
        "RuleCondition": {"Fn::Equals": [{"Ref": "Environment"}, "test"]},
        "Assertions": [{
            "Assert": {"Fn::Contains": [["small", "medium"], {"Ref": "Size"}]},
            "AssertDescription": SIZE_RULE
        }]
    }});
    template
}

/// Deploys `template` as a stack of its own, which must be refused before anything exists:
/// deploy_stack.py's error (its stderr).
fn refused_at_once(template: &Value, parameters: &[(&str, &str)]) -> String {
    let stack = unique("rules");
    let error = match deploy_as(&stack, template, parameters) {
        Ok(_) => panic!("deployed {parameters:?}, where the template's Rules refuse it"),
        Err(error) => error,
    };
    assert!(
        error.contains(&format!("CloudFormation refuses stack {stack}: ")),
        "not refused at CreateStack: {error}"
    );
    assert_eq!(stack_status(&stack), None, "a refused stack was created");
    error
}

#[test]
fn a_rule_refuses_a_parameter_value_with_its_assert_description() {
    // The template's defaults are what the rule reads when the request gives no value.
    let error = refused_at_once(&with_size_rule(), &[]);
    assert!(
        error.trim_end().ends_with(&format!(": {SIZE_RULE}")),
        "the refusal is not the AssertDescription: {error}"
    );
    refused_at_once(&with_size_rule(), &[("Size", "huge")]);
    deploy(&with_size_rule(), &[("Size", "small")]).expect("a size the rule allows deploys");
}

#[test]
fn a_rule_whose_condition_is_false_checks_nothing() {
    deploy(&with_size_rule(), &[("Environment", "prod")])
        .expect("the rule applies to a test environment only");
    // Without a RuleCondition, the assertions always apply.
    let mut template = with_size_rule();
    template["Rules"]["TestSizes"]
        .as_object_mut()
        .unwrap()
        .remove("RuleCondition");
    let error = refused_at_once(&template, &[("Environment", "prod")]);
    assert!(error.contains(SIZE_RULE), "{error}");
}

#[test]
fn rules_read_lists_numbers_and_pseudo_parameters_as_cloudformation_gives_them() {
    let mut template = template();
    let parameters = section(&mut template, "Parameters");
    parameters.insert(
        "Regions".into(),
        json!({"Type": "CommaDelimitedList", "Default": "us-east-1,eu-west-1"}),
    );
    parameters.insert("Replicas".into(), json!({"Type": "Number", "Default": 2}));
    parameters.insert(
        "Tier".into(),
        json!({"Type": "String", "Default": "shared"}),
    );
    template["Rules"] = json!({"Placement": {
        "RuleCondition": {"Fn::Equals": [{"Ref": "AWS::Region"}, "us-east-1"]},
        "Assertions": [
            {"Assert": {"Fn::EachMemberIn": [{"Ref": "Regions"}, ["us-east-1", "eu-west-1", "eu-central-1"]]},
             "AssertDescription": "Regions: us-east-1, eu-west-1 or eu-central-1."},
            {"Assert": {"Fn::And": [
                {"Fn::Contains": [["1", "2", "3"], {"Ref": "Replicas"}]},
                {"Fn::Not": [{"Fn::Equals": [{"Ref": "Replicas"}, 3]}]}]},
             "AssertDescription": "Replicas: 1 or 2."},
            {"Assert": {"Fn::Or": [
                {"Fn::EachMemberEquals": [{"Ref": "Regions"}, "us-east-1"]},
                {"Fn::Equals": [{"Ref": "Tier"}, "shared"]}]},
             "AssertDescription": "A dedicated tier stays in us-east-1."}
        ]
    }});
    deploy(&template, &[]).expect("the defaults pass every assertion");
    deploy(&template, &[("Replicas", "1"), ("Regions", "eu-central-1")])
        .expect("values the rule allows");
    deploy(
        &template,
        &[("Tier", "dedicated"), ("Regions", "us-east-1")],
    )
    .expect("a dedicated tier in us-east-1");
    for (parameters, description) in [
        (
            vec![("Regions", "us-east-1,ap-south-1")],
            "Regions: us-east-1, eu-west-1 or eu-central-1.",
        ),
        (vec![("Replicas", "3")], "Replicas: 1 or 2."),
        (
            vec![("Tier", "dedicated")],
            "A dedicated tier stays in us-east-1.",
        ),
    ] {
        let error = refused_at_once(&template, &parameters);
        assert!(
            error.trim_end().ends_with(description),
            "{parameters:?}: {error}"
        );
    }
}

#[test]
fn a_rule_function_the_local_server_does_not_evaluate_is_refused_by_name() {
    // Fn::RefAll reads the account's VPCs: CloudFormation evaluates it, the local server does
    // not, so it may not pass unevaluated, not even under a condition that is false.
    let mut template = with_size_rule();
    template["Rules"]["Vpcs"] = json!({
        "RuleCondition": {"Fn::Equals": [{"Ref": "Environment"}, "never"]},
        "Assertions": [{"Assert": {"Fn::Contains": [{"Fn::RefAll": "AWS::EC2::VPC::Id"}, "vpc-1"]}}]
    });
    let error = refused_at_once(&template, &[("Size", "small")]);
    for expected in [
        "Unsupported rule function Fn::RefAll",
        "Rules.Vpcs.Assertions[0].Assert",
        "Fix: ",
    ] {
        assert!(error.contains(expected), "no {expected:?}: {error}");
    }
    // A function that is no rule function at all, as CloudFormation refuses it.
    template["Rules"]["Vpcs"]["Assertions"][0]["Assert"] =
        json!({"Fn::Equals": [{"Fn::Sub": "${Size}"}, "small"]});
    let error = refused_at_once(&template, &[("Size", "small")]);
    assert!(
        error.contains(
            "Fn::Sub at Rules.Vpcs.Assertions[0].Assert.Fn::Equals[0] is not a rule function"
        ),
        "{error}"
    );
}

#[test]
fn an_update_that_breaks_a_rule_is_refused_and_changes_nothing() {
    let stack = unique("rules-update");
    deploy_as(&stack, &template(), &[]).expect("the stack to update");
    let sized = json!({
        "Parameters": {
            "Environment": {"Type": "String", "Default": "test"},
            "Size": {"Type": "String", "Default": "large"}
        },
        "Rules": with_size_rule()["Rules"],
        "Resources": {"PrefixParameter": ssm_parameter(json!("team-"))}
    });
    assert_eq!(update(&stack, &sized), Some(SIZE_RULE.to_owned()));
    assert_eq!(
        update_with(&stack, &sized, &[("Size", "huge")]),
        Some(SIZE_RULE.to_owned())
    );
    assert_eq!(
        stack_status(&stack).as_deref(),
        Some("CREATE_COMPLETE"),
        "a refused update changed the stack"
    );
    assert_eq!(
        update_with(&stack, &sized, &[("Size", "medium")]),
        None,
        "an update the rule allows"
    );
    assert_eq!(stack_status(&stack).as_deref(), Some("UPDATE_COMPLETE"));
}
