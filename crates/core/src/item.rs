//! The semaphore item: what one DynamoDB item per lock holds, as plain Rust values.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::input::{AcquisitionId, HolderId, Limit, LockName};

/// The item's version counter. Every mutation increments it and is conditioned on the version
/// it read, so a write computed from a state that has since changed is rejected (F1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Version(pub u64);

impl Version {
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

/// The version at which a slot was taken. Strictly increasing across all acquisitions of a lock,
/// so downstream systems can reject writes from an older holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(pub u64);

/// Who holds a slot: the execution and its logical acquire.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    pub holder: HolderId,
    pub acquisition: AcquisitionId,
}

impl Identity {
    pub fn new(holder: HolderId, acquisition: AcquisitionId) -> Self {
        Self {
            holder,
            acquisition,
        }
    }

    /// The key of this identity's entry in the item's holder map. Acquisition ids cannot contain
    /// '#', so the key is unambiguous.
    pub fn slot_key(&self) -> String {
        format!("{}#{}", self.holder, self.acquisition)
    }
}

/// One held slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub token: FencingToken,
    pub acquired_at_ms: u64,
}

/// A fence: a compact record that writes on behalf of an ended execution (or a released
/// acquisition) are refused until it expires. The key is a 96-bit digest of the identity, so a
/// fence costs ~35 bytes of the item whatever the length of the ARN; a digest collision could
/// only make a live acquire see `Fenced` (a retryable liveness blip), never admit a holder.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceKey(String);

impl FenceKey {
    /// Fences every acquisition of an execution: written by cleanup and the sweeper.
    pub fn execution(holder: &HolderId) -> Self {
        Self::digest(&["execution", holder.as_str()])
    }

    /// Fences one acquisition: written by release.
    pub fn acquisition(identity: &Identity) -> Self {
        Self::digest(&[
            "acquisition",
            identity.holder.as_str(),
            identity.acquisition.as_str(),
        ])
    }

    /// Rebuilds a key read back from the table.
    pub fn from_stored(key: String) -> Self {
        Self(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn digest(parts: &[&str]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        let digest = hasher.finalize();
        Self(digest[..12].iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// The whole state of one semaphore. The stored `count` attribute is derived from `holders`
/// when the item is written and checked against it when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreItem {
    pub lock: LockName,
    /// The limit the last acquire asked for; `None` while only release or cleanup has touched
    /// the lock.
    pub limit: Option<Limit>,
    pub version: Version,
    pub holders: BTreeMap<Identity, Holding>,
    /// Fence key -> expiry (epoch milliseconds). Expired fences are ignored and dropped by the
    /// next write, so this map holds only the fences of the last fence window.
    pub fences: BTreeMap<FenceKey, u64>,
}

impl SemaphoreItem {
    /// The state of a lock that has never been written: version 0, nothing held.
    pub fn empty(lock: LockName) -> Self {
        Self {
            lock,
            limit: None,
            version: Version(0),
            holders: BTreeMap::new(),
            fences: BTreeMap::new(),
        }
    }

    pub fn count(&self) -> usize {
        self.holders.len()
    }

    pub fn is_fenced(&self, key: &FenceKey, now_ms: u64) -> bool {
        self.fences
            .get(key)
            .is_some_and(|&expires| expires > now_ms)
    }

    /// Fences that are still in force at `now_ms`.
    pub fn live_fences(&self, now_ms: u64) -> usize {
        self.fences.values().filter(|&&e| e > now_ms).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_keys_are_stable_compact_and_distinct() {
        let h = HolderId::new("arn:aws:states:us-east-1:1:execution:m:e").unwrap();
        let a = AcquisitionId::new("a1").unwrap();
        let id = Identity::new(h.clone(), a);
        let exec = FenceKey::execution(&h);
        let acq = FenceKey::acquisition(&id);
        assert_eq!(exec.as_str().len(), 24);
        assert_ne!(exec, acq);
        // A stored fence must mean the same thing to the next release of the code: the value
        // is sha256("execution\0<arn>\0") cut to 12 bytes, as `sha256sum` computes it.
        assert_eq!(exec, FenceKey::execution(&h));
        assert_eq!(exec.as_str(), "0fcba051b0804e0de5511304");
    }
}
