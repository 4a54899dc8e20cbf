//! The sweeper binary, run as Lambda runs it (a stand-in Runtime API, 128 MB announced), sweeps
//! a table of 50,000 locks on the local server within the function's memory: it reads the table
//! a `Scan` page (1 MB) at a time and judges each page before it reads the next, so its peak
//! resident memory does not grow with the table. The table is filled with `BatchWriteItem`
//! (25 items a request, several requests at once); the sweep itself reads through the server.
//! Five holders whose executions do not exist, spread over the table, are reclaimed: the pages
//! are judged, not only read.
//!
//! `SWEEPER_EXE=<path>` runs another build of the function instead (an older one, to compare
//! its peak: the test prints the numbers before it checks them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use local_aws::runtime_api::{run_function_for, Answer};
use local_aws::{fresh_table, sdk_config};
use semaphore_core::dynamo::encode;
use semaphore_core::{
    AcquisitionId, Clock, HolderId, Identity, Limit, LockName, ManualClock, MemoryStore, Semaphore,
    MISSING_EXECUTION_GRACE_MS,
};
use serde_json::json;

const EXE: &str = env!("CARGO_BIN_EXE_sweeper");

/// Locks in the table.
const LOCKS: usize = 50_000;
/// The sweeper function's memory (template.yaml, `MemorySize`), in KiB.
const LAMBDA_MEMORY_KIB: u64 = 128 * 1024;
/// What a sweep may hold above the function's own size (its peak on an empty table): a 1 MB
/// `Scan` page as the SDK reads it and the page's items decoded, several times over, not the
/// table (which the old sweep held whole: 85.6 MiB above its own size at 50,000 locks, a
/// debug build).
const PAGE_BUDGET_KIB: u64 = 40 * 1024;
/// Locks whose holder's execution does not exist: reclaimed by the sweep.
const GONE_AT: [usize; 5] = [0, 12_345, 25_000, 37_500, LOCKS - 1];
/// BatchWriteItem requests in flight while the table is filled.
const FILLERS: usize = 8;
/// DynamoDB's BatchWriteItem takes at most 25 put requests.
const BATCH: usize = 25;

/// The item of lock `n`, held by one execution (of a machine the sweeper does not judge, so it
/// makes no call, or of the judged machine and gone), made by the core's own acquire.
async fn item(n: usize, judged_machine: &str, acquired_ms: u64) -> semaphore_core::SemaphoreItem {
    let store = MemoryStore::new();
    let sem = Semaphore::new(&store).with_clock(Arc::new(ManualClock::new(acquired_ms)));
    let lock = LockName::new(format!("lock-{n:05}")).unwrap();
    let holder = if GONE_AT.contains(&n) {
        format!("arn:aws:states:us-east-1:123456789012:execution:{judged_machine}:gone-{n}")
    } else {
        format!("arn:aws:states:us-east-1:123456789012:execution:other-team-work:exec-{n:05}")
    };
    let identity = Identity::new(
        HolderId::new(holder).unwrap(),
        AcquisitionId::new("r0").unwrap(),
    );
    sem.acquire(&lock, &identity, Limit::new(10).unwrap())
        .await
        .unwrap();
    store.load_now(&lock).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_of_50_000_locks_is_swept_within_the_functions_memory() {
    let store = fresh_table().await;
    let table = store.table().to_owned();
    let client = store.client().clone();
    let sfn = local_aws::sfn::client();
    let machine = format!("Sweep-{:x}", fastrand::u64(..));
    let machine_arn = sfn
        .create_state_machine()
        .name(&machine)
        .definition(
            r#"{"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 3600, "End": true}}}"#,
        )
        .role_arn("arn:aws:iam::123456789012:role/semaphore-test")
        .send()
        .await
        .unwrap()
        .state_machine_arn()
        .to_owned();
    let topic_arn = aws_sdk_sns::Client::new(&sdk_config())
        .create_topic()
        .name(format!("sweeper-memory-{:x}", fastrand::u64(..)))
        .send()
        .await
        .unwrap()
        .topic_arn()
        .unwrap()
        .to_owned();

    let exe = std::env::var("SWEEPER_EXE").unwrap_or_else(|_| EXE.to_owned());
    let sweep = |table: String| {
        let (exe, topic_arn, machine_arn) = (exe.clone(), topic_arn.clone(), machine_arn.clone());
        tokio::task::spawn_blocking(move || {
            run_function_for(
                std::path::Path::new(&exe),
                &[
                    ("TABLE_NAME", table.as_str()),
                    ("TOPIC_ARN", topic_arn.as_str()),
                    ("PROTECTED_STATE_MACHINES", machine_arn.as_str()),
                ],
                vec![
                    json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}),
                ],
                // The local server's Scan takes ~6 s a 1 MB page (5,000 of these items).
                Duration::from_secs(300),
            )
        })
    };
    // The function's own size: a sweep of an empty table.
    let empty = sweep(fresh_table().await.table().to_owned()).await.unwrap();
    let empty_kib = empty
        .peak_rss_kib
        .expect("the function's peak resident memory");
    eprintln!(
        "an empty table swept: peak resident memory {:.1} MiB",
        empty_kib as f64 / 1024.0
    );

    // Acquired past the grace period: "does not exist" is believed of the gone holders.
    let acquired_ms = semaphore_core::SystemClock.now_ms() - MISSING_EXECUTION_GRACE_MS - 60_000;
    let filling = Instant::now();
    let batches: Vec<Vec<usize>> = (0..LOCKS)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(<[usize]>::to_vec)
        .collect();
    let batches = Arc::new(std::sync::Mutex::new(batches));
    let mut fillers = Vec::new();
    for _ in 0..FILLERS {
        let (client, table, machine, batches) = (
            client.clone(),
            table.clone(),
            machine.clone(),
            batches.clone(),
        );
        fillers.push(tokio::spawn(async move {
            loop {
                let Some(batch) = batches.lock().unwrap().pop() else {
                    return;
                };
                let mut puts = Vec::with_capacity(batch.len());
                for n in batch {
                    let put = PutRequest::builder()
                        .set_item(Some(encode(&item(n, &machine, acquired_ms).await)))
                        .build()
                        .unwrap();
                    puts.push(WriteRequest::builder().put_request(put).build());
                }
                let answer = client
                    .batch_write_item()
                    .request_items(&table, puts)
                    .send()
                    .await
                    .expect("BatchWriteItem");
                assert!(
                    answer
                        .unprocessed_items()
                        .is_none_or(|left| left.is_empty()),
                    "the local server left items unwritten"
                );
            }
        }));
    }
    for filler in fillers {
        filler.await.unwrap();
    }
    eprintln!("filled {LOCKS} locks in {:.1?}", filling.elapsed());

    let sweeping = Instant::now();
    let run = sweep(table).await.unwrap();
    let [Answer::Response(summary)] = &run.answers[..] else {
        panic!(
            "one answer expected: {:?}\nstderr: {}",
            run.answers, run.stderr
        );
    };
    let peak_kib = run
        .peak_rss_kib
        .expect("the function's peak resident memory");
    eprintln!(
        "swept {LOCKS} locks in {:.1?}: {} pages, peak resident memory {:.1} MiB",
        sweeping.elapsed(),
        summary["pages"],
        peak_kib as f64 / 1024.0
    );
    assert!(
        peak_kib < LAMBDA_MEMORY_KIB,
        "the sweep peaked at {peak_kib} KiB, over the function's {LAMBDA_MEMORY_KIB} KiB"
    );
    // What the table costs it, over the function's own size: a page or two, not the table.
    // (The sweeper that loaded the whole table, measured here on 2026-12-07: 24.0 MiB for an
    // empty table, 109.6 MiB for these 50,000 locks, 85.6 MiB more; this one: 22.5 MiB more.)
    let growth_kib = peak_kib.saturating_sub(empty_kib);
    assert!(
        growth_kib < PAGE_BUDGET_KIB,
        "the sweep of {LOCKS} locks took {growth_kib} KiB more than an empty table's, over the \
         {PAGE_BUDGET_KIB} KiB of a few pages: does it hold more than a page at a time?"
    );
    assert_eq!(summary["locks"], json!(LOCKS), "{summary}");
    assert_eq!(summary["holders_checked"], json!(LOCKS), "{summary}");
    assert_eq!(summary["reclaimed"], json!(GONE_AT.len()), "{summary}");
    assert_eq!(
        summary["notices_published"],
        json!(GONE_AT.len()),
        "{summary}"
    );
    assert_eq!(summary["errors"], json!([]), "{summary}");
    assert!(
        summary["pages"].as_u64().unwrap() > 1,
        "a table of {LOCKS} locks is more than one 1 MB page: {summary}"
    );
}
