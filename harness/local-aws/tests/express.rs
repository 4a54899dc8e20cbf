//! What the local server's Step Functions does with Express machines and Distributed Maps, as
//! AWS does it (the patches in `local/moto_server.py`, #27): an Express definition that waits
//! for a callback is refused; every start of an Express machine is a new execution, which a
//! client can neither describe nor list; a Distributed Map whose children are Express accepts
//! its definition, gives each child an execution id of its own, and fails when a child fails
//! (its tolerated failures are 0 by default). The 5-minute cap of an Express execution
//! (`patch_express_duration`) takes five minutes to see and is left to the patch's own check
//! of moto's source.

use aws_sdk_sfn::error::DisplayErrorContext;
use aws_sdk_sfn::types::StateMachineType;
use local_aws::sfn::{client, create_machine, described, ended, start, unique};
use serde_json::{json, Value};

const ROLE: &str = "arn:aws:iam::123456789012:role/semaphore-test";

async fn create_express(
    sfn: &aws_sdk_sfn::Client,
    name: &str,
    definition: &Value,
) -> Result<String, String> {
    sfn.create_state_machine()
        .name(name)
        .r#type(StateMachineType::Express)
        .definition(definition.to_string())
        .role_arn(ROLE)
        .send()
        .await
        .map(|made| made.state_machine_arn().to_owned())
        .map_err(|e| DisplayErrorContext(e).to_string())
}

#[tokio::test]
async fn an_express_machine_cannot_wait_for_a_callback_and_its_executions_cannot_be_described() {
    let sfn = client();
    let waits = json!({"StartAt": "W", "States": {"W": {
        "Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {"FunctionName": "f", "Payload": {"t.$": "$$.Task.Token"}}, "End": true}}});
    let refused = create_express(&sfn, &unique("express-waits"), &waits)
        .await
        .expect_err("an Express machine that waits for a task token");
    assert!(refused.contains("InvalidDefinition"), "{refused}");

    let pass = json!({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": true}}});
    let machine = create_express(&sfn, &unique("express-pass"), &pass)
        .await
        .expect("an Express machine");
    // The same name twice: two executions (asynchronous Express has no name idempotency).
    let first = start(&sfn, &machine, "same", &json!({})).await;
    let second = start(&sfn, &machine, "same", &json!({})).await;
    assert_ne!(first, second);
    let describe = sfn
        .describe_execution()
        .execution_arn(&first)
        .send()
        .await
        .expect_err("AWS does not describe an Express execution");
    assert!(
        DisplayErrorContext(&describe)
            .to_string()
            .contains("InvalidArn"),
        "{}",
        DisplayErrorContext(&describe)
    );
    let list = sfn
        .list_executions()
        .state_machine_arn(&machine)
        .send()
        .await
        .expect_err("AWS does not list an Express machine's executions");
    assert!(
        DisplayErrorContext(&list)
            .to_string()
            .contains("StateMachineTypeNotSupported"),
        "{}",
        DisplayErrorContext(&list)
    );
}

/// A standard parent whose Distributed Map runs Express children: each child's
/// `$$.Execution.Id` is its own (what the semaphore takes as the holder), and a child that
/// fails fails the map.
#[tokio::test]
async fn a_distributed_maps_express_children_are_executions_of_their_own_and_a_failure_fails_the_map(
) {
    let sfn = client();
    let definition = json!({"StartAt": "Each", "States": {"Each": {
        "Type": "Map", "ItemsPath": "$.items", "MaxConcurrency": 3,
        "ItemSelector": {"item.$": "$$.Map.Item.Value"},
        "ItemProcessor": {
            "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"},
            "StartAt": "Fail?",
            "States": {
                "Fail?": {"Type": "Choice", "Choices": [
                    {"Variable": "$.item", "NumericEquals": 0, "Next": "Fail"}],
                    "Default": "Who"},
                "Fail": {"Type": "Fail", "Error": "ItemFailed"},
                "Who": {"Type": "Pass", "Parameters": {"id.$": "$$.Execution.Id"}, "End": true}
            }
        },
        "End": true}}});
    let name = unique("map-parent");
    let machine = create_machine(&sfn, &name, &definition).await;
    let run = start(&sfn, &machine, "ok", &json!({"items": [1, 2, 3, 4, 5]})).await;
    assert_eq!(ended(&sfn, &run).await, "SUCCEEDED");
    let (_, output) = described(&sfn, &run).await;
    let ids: Vec<String> = output
        .expect("an output")
        .as_array()
        .expect("the children's outputs")
        .iter()
        .map(|child| child["id"].as_str().expect("an id").to_owned())
        .collect();
    let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 5, "{ids:?}");
    assert!(
        ids.iter()
            .all(|id| id.contains(&format!(":{name}/")) && !id.ends_with(&format!(":{name}:ok"))),
        "each child an execution of <machine>/<map run>, not the parent: {ids:?}"
    );

    let failing = start(&sfn, &machine, "one-fails", &json!({"items": [1, 0, 3]})).await;
    assert_eq!(ended(&sfn, &failing).await, "FAILED");
    let history = sfn
        .get_execution_history()
        .execution_arn(&failing)
        .send()
        .await
        .expect("the history");
    let failed = history
        .events()
        .iter()
        .find_map(|e| e.execution_failed_event_details())
        .expect("an ExecutionFailed event");
    assert_eq!(
        failed.error(),
        Some("States.ExceedToleratedFailureThreshold")
    );
}
