//! The lock's operator configuration (F14): one write that sets it.

use crate::input::{LockConfig, LockName};
use crate::write::{Change, Write};

/// Sets (`None`: removes) the lock's operator configuration (F14). It needs no check: it takes
/// nothing from a holder (a lower limit only stops admissions until the weight held is under
/// it), and every acquisition or grant in flight that assumed the configuration it replaces is
/// refused when it lands and asks again on this one.
pub fn configure(lock: &LockName, config: Option<LockConfig>) -> Write {
    Write {
        lock: lock.clone(),
        checks: Vec::new(),
        changes: vec![Change::Configure(config)],
    }
}
