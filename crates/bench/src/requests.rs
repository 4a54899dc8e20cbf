//! (a) DynamoDB requests per uncontended critical section (acquire + release), counted exactly
//! by an SDK interceptor, for our protocol in its configurations and for the AWS sample's.

use semaphore_core::{
    AcquireOutcome, AcquisitionId, DynamoStore, HolderId, Identity, Limit, LockName,
    ReleaseOutcome, Semaphore,
};
use semaphore_tests::counter::{Counts, RequestCounter};
use semaphore_tests::reference::SampleProtocol;
use serde::Serialize;

use crate::common::{execution_arn, uuid};

#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub scenario: &'static str,
    pub sections: usize,
    pub requests_per_section: f64,
    pub get_item: f64,
    pub put_item: f64,
    pub update_item: f64,
    pub failed_conditional_writes: f64,
}

fn row(scenario: &'static str, sections: usize, counts: &Counts) -> RequestRow {
    let per = |n: u64| n as f64 / sections as f64;
    RequestRow {
        scenario,
        sections,
        requests_per_section: per(counts.total()),
        get_item: per(counts.get("DynamoDB.GetItem")),
        put_item: per(counts.get("DynamoDB.PutItem")),
        update_item: per(counts.get("DynamoDB.UpdateItem")),
        failed_conditional_writes: per(counts.total_failed()),
    }
}

fn identity(n: usize) -> Identity {
    Identity::new(
        HolderId::new(execution_arn("uncontended", n)).expect("holder"),
        AcquisitionId::new(uuid()).expect("acquisition"),
    )
}

async fn section(
    acquirer: &Semaphore<DynamoStore>,
    releaser: &Semaphore<DynamoStore>,
    lock: &LockName,
    n: usize,
) {
    let who = identity(n);
    let limit = Limit::new(5).expect("limit");
    match acquirer.acquire(lock, &who, limit).await {
        Ok(AcquireOutcome::Acquired { .. }) => {}
        other => panic!("uncontended acquire gave {other:?}"),
    }
    match releaser.release(lock, &who).await {
        Ok(ReleaseOutcome::Released { .. }) => {}
        other => panic!("uncontended release gave {other:?}"),
    }
}

/// `sections` critical sections one after the other on a lock nobody else uses, per scenario.
pub async fn run(endpoint: &str, table: &str, sections: usize) -> Vec<RequestRow> {
    let mut rows = Vec::new();
    let counter = RequestCounter::new();
    let semaphore = |cache: bool| {
        let sem = Semaphore::new(DynamoStore::new(counter.dynamodb_client(endpoint), table));
        if cache {
            sem
        } else {
            sem.with_item_cache(0)
        }
    };

    // One process does acquire and release (a worker, a service, semctl in a loop).
    for (scenario, cache) in [
        ("ours: one process, item cache (default)", true),
        ("ours: one process, read first (cache off)", false),
    ] {
        let sem = semaphore(cache);
        let lock = LockName::new(format!("requests-{}", uuid())).expect("lock");
        section(&sem, &sem, &lock, 0).await; // creates the item; not counted
        counter.take();
        for n in 1..=sections {
            section(&sem, &sem, &lock, n).await;
        }
        rows.push(row(scenario, sections, &counter.take()));
    }

    // As deployed: acquire and release are different Lambda functions, so different
    // processes, each with whatever it last saw of the lock.
    for (scenario, cache) in [
        (
            "ours: acquire and release in different processes (the Lambdas), read first",
            false,
        ),
        (
            "ours: acquire and release in different processes, item cache on",
            true,
        ),
    ] {
        let (acquirer, releaser) = (semaphore(cache), semaphore(cache));
        let lock = LockName::new(format!("requests-{}", uuid())).expect("lock");
        section(&acquirer, &releaser, &lock, 0).await;
        counter.take();
        for n in 1..=sections {
            section(&acquirer, &releaser, &lock, n).await;
        }
        rows.push(row(scenario, sections, &counter.take()));
    }

    let sample = SampleProtocol {
        client: counter.dynamodb_client(endpoint),
        table: table.to_owned(),
    };
    let lock = format!("requests-{}", uuid());
    sample.init(&lock).await;
    counter.take();
    for n in 1..=sections {
        let holder = execution_arn("uncontended", n);
        assert!(sample.acquire(&lock, &holder, 5).await, "sample acquire");
        assert!(sample.release(&lock, &holder).await, "sample release");
    }
    rows.push(row("AWS sample (reference)", sections, &counter.take()));
    rows
}
