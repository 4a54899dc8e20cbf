//! Step Functions' 256 KiB quota on what a task is scheduled with, enforced by the local server
//! as on AWS (`local/moto_server.py`, `patch_task_parameters_quota`): Step Functions service
//! quotas, "Maximum input or output size for a task, state, or execution: 256 KiB of data as a
//! UTF-8 encoded string", which applies to "input data when scheduling a task". moto 5.2.5
//! checked only results and state outputs, so a Lambda payload that carried the execution
//! input beside more never failed locally.
//!
//! A machine of one `sqs:sendMessage` task (moto runs it locally, no Lambda needed) sends the
//! execution input twice: an input of 120,000 bytes makes parameters under the quota, one of
//! 140,000 bytes parameters over it. Its Retry and Catch of `States.ALL` do not handle the
//! error: on AWS it is terminal (`patch_data_limit_is_terminal`).

use local_aws::sfn::{client as sfn_client, create_machine, described, ended, start, unique};
use serde_json::json;

#[tokio::test]
async fn a_task_scheduled_with_more_than_256_kib_fails_with_data_limit_exceeded() {
    let sfn = sfn_client();
    let sqs = aws_sdk_sqs::Client::new(&local_aws::sdk_config());
    let queue = sqs
        .create_queue()
        .queue_name(unique("payload-limit"))
        .send()
        .await
        .expect("create a queue")
        .queue_url()
        .expect("a queue URL")
        .to_owned();
    // A Catch and a Retry of States.ALL, which on AWS do not match States.DataLimitExceeded:
    // "a terminal error that can't be caught by the States.ALL error type".
    let definition = json!({
        "StartAt": "Send the input twice",
        "States": {
            "Send the input twice": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sqs:sendMessage",
                "Parameters": {
                    "QueueUrl": queue,
                    "MessageBody": {"a.$": "$$.Execution.Input", "b.$": "$$.Execution.Input"}
                },
                "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 2, "IntervalSeconds": 1}],
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Caught"}],
                "End": true
            },
            "Caught": {"Type": "Succeed"}
        }
    });
    let machine = create_machine(&sfn, &unique("payload-limit"), &definition).await;
    let run = |padding: usize| {
        let (sfn, machine) = (sfn.clone(), machine.clone());
        async move {
            let input = json!({ "padding": "x".repeat(padding) });
            let execution = start(&sfn, &machine, &unique("run"), &input).await;
            let status = ended(&sfn, &execution).await;
            let failure = sfn
                .describe_execution()
                .execution_arn(&execution)
                .send()
                .await
                .expect("describe");
            (
                status,
                failure.error().map(str::to_owned),
                failure.cause().map(str::to_owned),
                described(&sfn, &execution).await.1,
            )
        }
    };
    let (status, error, _, _) = run(120_000).await;
    assert_eq!(
        (status.as_str(), error),
        ("SUCCEEDED", None),
        "parameters of about 240,000 bytes are within the quota"
    );
    let (status, error, cause, _) = run(140_000).await;
    assert_eq!(status, "FAILED", "not caught by States.ALL");
    assert_eq!(error.as_deref(), Some("States.DataLimitExceeded"));
    let cause = cause.unwrap_or_default();
    assert!(
        cause.contains("more than the 262144 bytes a task may be scheduled with"),
        "{cause}"
    );
}
