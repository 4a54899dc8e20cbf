//! Validated inputs from literals, for tests. A test's names are known to be good, so a bad one
//! is a bug in the test and panics at once, instead of every test file repeating the unwraps.

use semaphore_core::{AcquisitionId, HolderId, Identity, Limit, LockName};

pub fn lock(name: &str) -> LockName {
    LockName::new(name).expect("a valid lock name in the test")
}

pub fn id(holder: &str, acquisition: &str) -> Identity {
    Identity::new(
        HolderId::new(holder).expect("a valid holder in the test"),
        AcquisitionId::new(acquisition).expect("a valid acquisition id in the test"),
    )
}

pub fn limit(n: i64) -> Limit {
    Limit::new(n).expect("a valid limit in the test")
}
