//! A lock's layout in the DynamoDB store, against the local server: a lock moved to the gate
//! layout (issue #28) is stored in the gate's format, which every write this store renders for
//! the item layout checks, so none lands in a gate: each is refused, named, and writes nothing.
//!
//! Needs the repository's `.venv` and the local server (`bash tests/run.sh` starts it).

use local_aws::fresh_table;
use local_aws::observe::raw_item;
use semaphore_core::dynamo::{FORMAT, GATE_FORMAT};
use semaphore_core::{
    AcquisitionId, Error, HolderId, Identity, Layout, Limit, LockName, Semaphore, StoreError,
};

fn id(holder: &str) -> Identity {
    Identity::new(
        HolderId::new(holder).unwrap(),
        AcquisitionId::new("r0").unwrap(),
    )
}

#[tokio::test]
async fn a_gate_is_stored_in_its_own_format_and_no_item_layout_write_lands_in_it() {
    let store = fresh_table().await;
    let (client, table) = (store.client().clone(), store.table().to_owned());
    let sem = Semaphore::new(store);
    let format = |lock: &'static str| {
        let (client, table) = (client.clone(), table.clone());
        async move {
            let raw = raw_item(&client, &table, lock).await.expect("an item");
            (
                raw["format"].as_n().unwrap().parse::<u64>().unwrap(),
                raw["version"].as_n().unwrap().to_owned(),
            )
        }
    };

    let gate = LockName::new("wide").unwrap();
    assert_eq!(
        sem.set_layout(&gate, Layout::Gate).await.unwrap().layout,
        Layout::Gate
    );
    let (stored, version) = format("wide").await;
    assert_eq!(stored, GATE_FORMAT);
    assert_eq!(sem.status(&gate).await.unwrap().layout, Layout::Gate);
    // Asked again: answered from the item as it is.
    assert_eq!(
        sem.set_layout(&gate, Layout::Gate).await.unwrap().layout,
        Layout::Gate
    );

    // An acquire rendered for the item layout meets the gate's format: refused, named.
    let refused = sem
        .acquire(&gate, &id("exec-1"), Limit::new(2).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            Error::Store(StoreError::LayoutNotStored {
                layout: Layout::Gate,
                ..
            })
        ),
        "{refused}"
    );
    assert_eq!(
        format("wide").await,
        (GATE_FORMAT, version),
        "nothing written"
    );

    // A lock in use stays where it is.
    let busy = LockName::new("busy").unwrap();
    sem.acquire(&busy, &id("exec-2"), Limit::new(2).unwrap())
        .await
        .unwrap();
    let refused = sem.set_layout(&busy, Layout::Gate).await.unwrap_err();
    assert!(
        matches!(refused, Error::NotIdle { used: 1, .. }),
        "{refused}"
    );
    assert_eq!(format("busy").await.0, FORMAT);
}
