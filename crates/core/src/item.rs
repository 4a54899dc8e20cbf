//! The semaphore item: what one DynamoDB item per lock holds, as plain Rust values.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use crate::input::{
    AcquisitionId, HolderId, InputError, Limit, LockConfig, LockName, Rate, Terms, Weight,
};

/// The item's version counter. Every write increments it, so the fencing tokens it hands out are
/// strictly increasing per lock.
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

impl FencingToken {
    /// The largest token a lock can give ([`crate::input::MAX_FENCING_TOKEN`]).
    pub const MAX: u64 = crate::input::MAX_FENCING_TOKEN;

    /// A token a caller shows (a release's, a heartbeat's): from 1 to [`FencingToken::MAX`].
    pub fn new(token: u64) -> Result<Self, InputError> {
        if !(1..=Self::MAX).contains(&token) {
            return Err(InputError::InvalidToken {
                got: token.to_string(),
            });
        }
        Ok(Self(token))
    }
}

/// One run of an execution: 0 for its first, n after its n-th redrive (Step Functions'
/// `$$.Execution.RedriveCount`, `redriveCount` in `DescribeExecution`).
///
/// A redriven execution keeps its ARN but runs again (F7), so an execution is fenced run by
/// run: the cleanup of a run that ended fences that run and every run before it, never one to
/// come, and each fence key is written only once its run has ended. That is what the fence
/// window is derived for (every acquire a fence must stop was requested before the fence was
/// first written): with one key for every run, a second cleanup after a redrive would add a key
/// that is already there, keep its first age, and let a rotation drop it a window too early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Run(pub u32);

impl Run {
    /// An execution's first run (never redriven).
    pub const FIRST: Self = Self(0);

    /// The last run an execution can have ([`crate::input::MAX_RUN`]).
    pub const MAX: Self = Self(crate::input::MAX_RUN);

    /// Run `n`, if an execution can have it (at most [`Run::MAX`]).
    pub fn new(n: u32) -> Result<Self, InputError> {
        if n > Self::MAX.0 {
            return Err(InputError::RunTooLate { run: n });
        }
        Ok(Self(n))
    }

    /// This run and every run before it.
    pub fn and_earlier(self) -> impl Iterator<Item = Run> {
        (0..=self.0).map(Run)
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run {}", self.0)
    }
}

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
    /// '#', so the key is unambiguous: the holder is everything before its last '#'.
    pub fn slot_key(&self) -> String {
        format!("{}#{}", self.holder, self.acquisition)
    }

    /// The bytes this identity's entry in the holder map takes, as DynamoDB sizes a map element
    /// ("DynamoDB item sizes and formats": its name, its value and 1 byte), with the value at its
    /// largest ([`HOLDING_VALUE_BYTES`]): what the item's `held_bytes` counts for it, added by
    /// the write that puts the holder and subtracted by the one that removes it.
    pub fn held_bytes(&self) -> u64 {
        let key = self.holder.as_str().len() + 1 + self.acquisition.as_str().len();
        key as u64 + HOLDING_VALUE_BYTES + 1
    }

    /// The identity a holder-map key names (the inverse of [`Identity::slot_key`]).
    pub fn from_slot_key(key: &str) -> Result<Self, SlotKeyError> {
        let (holder, acquisition) = key.rsplit_once('#').ok_or(SlotKeyError::Shape)?;
        Ok(Self::new(
            HolderId::new(holder)?,
            AcquisitionId::new(acquisition)?,
        ))
    }
}

/// A holder-map key that names no identity (see [`Identity::from_slot_key`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotKeyError {
    #[error("expected <holder>#<acquisition>")]
    Shape,
    #[error(transparent)]
    Invalid(#[from] InputError),
}

/// The most bytes a holding's stored number takes: at most 32 digits (see
/// `dynamo::TIME_SPAN`), and DynamoDB sizes a number at 1 byte per two significant digits plus 1.
pub const HOLDING_VALUE_BYTES: u64 = 17;

/// The largest holder-map entry: the longest holder and acquisition id accepted
/// (`input::MAX_HOLDER_BYTES`, `input::MAX_ACQUISITION_BYTES`).
pub const MAX_HELD_BYTES: u64 =
    (crate::input::MAX_HOLDER_BYTES + 1 + crate::input::MAX_ACQUISITION_BYTES) as u64
        + HOLDING_VALUE_BYTES
        + 1;

/// The item's budget, against DynamoDB's 400 KB item limit ("Constraints in Amazon DynamoDB",
/// "Items": "The maximum item size in DynamoDB is 400 KB", 409,600 bytes, names and values).
/// A write that would make the item bigger is refused with a ValidationException ("Item size to
/// update has exceeded the maximum allowed size"), so the item must never come near it:
///
/// - holders: `held_bytes` at most 300 KB (307,200 bytes; about 600 holders with 480-byte
///   execution ARNs; a limit of 1,000 holders of the longest names, 659 bytes each, cannot fit
///   in 400 KB at all);
/// - fences: 8 bytes each, at most [`FENCES_PER_GENERATION`] in each of the two generations
///   (64 KB) while anything is admitted;
/// - the rest, about 36 KB after the lock's name and the other attributes (under 1 KB), is what
///   the writes that must always land may add once admission stops: a release or cleanup removes
///   a holder (at least 21 bytes) for each fence (8 bytes) it adds with it, so it only shrinks the
///   item; a cleanup's fence of an execution that holds nothing, and a release of an acquisition
///   that holds nothing, add 8 bytes a run: 4,500 of them within a window, until the next
///   rotation drops a generation.
///
/// Acquires and grants are admitted only while there is room for the largest entry (an
/// acquisition past the budget is answered `full`, and waits in line), so releases and
/// cleanups, which only remove holders, always land.
pub const HELD_BYTES_BUDGET: u64 = 300 * 1024;

/// Fences in one generation (young or old) beyond which nothing is admitted: see
/// [`HELD_BYTES_BUDGET`]. 4,096 fences are 32 KB; a lock needs that many only past 400 releases
/// a second at the default fence window.
pub const FENCES_PER_GENERATION: usize = 4096;

/// One held slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holding {
    pub token: FencingToken,
    pub acquired_at_ms: u64,
    /// How many of the limit's units it takes.
    pub weight: Weight,
}

/// What a release or heartbeat shows of the slot it is about (F15): it frees or renews only the
/// slot whose fencing token it shows, so a caller that passes another slot's acquire answer (a
/// `$.semaphore` taken from the wrong branch, another tenant) is refused and writes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Claim {
    /// The acquire answer's fencing token, and the weight the acquisition asked for (a wrong
    /// weight costs a write more, never the wrong slot).
    Slot { token: FencingToken, weight: Weight },
    /// An operator's (`semctl` without `--token`): whatever slot the acquisition holds, read
    /// first. No payload can ask for it.
    Operator,
}

impl Claim {
    /// The token shown (`None`: the operator's claim, any token).
    pub fn token(&self) -> Option<FencingToken> {
        match self {
            Self::Slot { token, .. } => Some(*token),
            Self::Operator => None,
        }
    }

    /// Whether the claim covers the slot `holding`.
    pub fn covers(&self, holding: &Holding) -> bool {
        self.token().is_none_or(|token| token == holding.token)
    }
}

/// One slot taken back because its lease passed unrenewed (F13): what an operator is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenBackSlot {
    pub lock: LockName,
    pub identity: Identity,
    /// As it was held: its token (the holder's, now fenced), weight and when it was taken.
    pub holding: Holding,
    /// When its lease ended (the writer's clock that last set it).
    pub lease_until_ms: u64,
    /// When it was taken back (this writer's clock).
    pub taken_at_ms: u64,
}

/// A fence: a compact record that writes on behalf of an ended execution (or a released
/// acquisition) are refused while it is kept. The key is a 64-bit digest of the identity, so a
/// fence costs 8 bytes of the item whatever the length of the ARN. A digest collision (odds
/// about live fences / 2^64 per acquire) could only make a live acquire see `Fenced`, a liveness
/// blip the caller sees by name, never admit a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceKey([u8; FenceKey::LEN]);

impl FenceKey {
    /// Bytes of a key as stored.
    pub const LEN: usize = 8;

    /// Fences every acquisition of one run of an execution: written by cleanup and the sweeper
    /// once that run has ended. The first run's key is the execution's alone, without a run.
    pub fn execution(holder: &HolderId, run: Run) -> Self {
        if run == Run::FIRST {
            Self::digest(&["execution", holder.as_str()])
        } else {
            Self::digest(&["execution", holder.as_str(), &run.0.to_string()])
        }
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
    pub fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    fn digest(parts: &[&str]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        let digest = hasher.finalize();
        let mut key = [0u8; Self::LEN];
        key.copy_from_slice(&digest[..Self::LEN]);
        Self(key)
    }
}

impl std::fmt::Display for FenceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The fences of a lock, in two generations.
///
/// Release and cleanup add their fence to `young`. A *rotation* moves what it saw in `young` to
/// `old` and drops what was in `old`, and is allowed only once the fence window has passed since
/// the previous one; so every fence is kept for at least one window (it sits in `young` until a
/// rotation, then in `old` for at least a window) and at most about two. No fence carries an
/// expiry: a set of 8-byte keys is what the acquire's condition checks at write time, and the
/// item stays at 8 bytes per fence of the last one or two windows.
///
/// `rotated_at_ms` is when the last rotation happened (by the rotating writer's clock). Every
/// acquire's condition names it: an acquire is refused once a rotation happened later than its
/// request's *horizon* (see [`crate::protocol::Timing`]), so a write decided before fences it
/// should have met were dropped can never land.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Fences {
    pub young: BTreeSet<FenceKey>,
    pub old: BTreeSet<FenceKey>,
    pub rotated_at_ms: Option<u64>,
}

impl Fences {
    pub fn contains(&self, key: &FenceKey) -> bool {
        self.young.contains(key) || self.old.contains(key)
    }

    /// Fences kept now (a key in both generations counts once).
    pub fn len(&self) -> usize {
        self.young.union(&self.old).count()
    }

    pub fn is_empty(&self) -> bool {
        self.young.is_empty() && self.old.is_empty()
    }
}

/// Where a lock keeps its holders, and so what one of its writes costs.
///
/// - `Item`: everything in the lock's one item (holders, leases, every fence). One plain write
///   per operation, but every write is billed by the whole item: about 150 bytes a holder, and
///   8 bytes for every release of the last window or two, so a lock of many holders or a high
///   rate costs more per critical section, and a limit stops where the item stops growing
///   ([`HELD_BYTES_BUDGET`]).
/// - `Gate`: the lock's item is a small gate (the count, the line, the rate, the configuration
///   and the fences of ended executions), and each holding is an item of its own, written in
///   the same transaction as the gate. A released acquisition's fence is its holding item left
///   behind as a *tombstone*, dropped once a rotation of the gate's fences makes every late
///   attempt of it expire ([`SemaphoreItem::passed_tombstones`]). A critical section costs the
///   same whatever the limit and the rate.
///
/// A lock's writes mean the same in both ([`crate::write::Write::apply`]); only where they land
/// differs. A lock changes layout only while idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Layout {
    #[default]
    Item,
    Gate,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Item => "item",
            Self::Gate => "gate",
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Layout {
    type Err = InputError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "item" => Ok(Self::Item),
            "gate" => Ok(Self::Gate),
            other => Err(InputError::Layout {
                got: other.to_owned(),
            }),
        }
    }
}

/// The whole state of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SemaphoreItem {
    pub lock: LockName,
    /// Where its holders and fences are kept (see [`Layout`]).
    pub layout: Layout,
    /// The limit the last acquire asked for; `None` while only release or cleanup has touched
    /// the lock.
    pub limit: Option<Limit>,
    /// Incremented by every write: the fencing token of an acquire is the version its write
    /// made.
    pub version: Version,
    pub holders: BTreeMap<Identity, Holding>,
    pub fences: Fences,
    /// Waiters in the lock's line (see [`crate::queue`]): changed only by the writes that queue
    /// or unqueue one, together with the waiter's own record.
    pub waiting: u64,
    /// The sum of the holders' weights, stored so that DynamoDB can check the limit when an
    /// acquire lands (`used <= limit - weight`): changed only by the writes that put or remove a
    /// holder, by that holder's weight, so it always equals the sum (S1).
    pub used: u64,
    /// The start rate the last acquisition asked for (`None`: none), shown by `semctl status`.
    pub rate: Option<Rate>,
    /// The bytes of the holder map's entries ([`Identity::held_bytes`] of each holder), stored so
    /// that DynamoDB can keep the item under its size limit when an acquire lands (see
    /// [`HELD_BYTES_BUDGET`]): changed only by the writes that put or remove a holder, as `used`
    /// is, so it always equals the sum.
    pub held_bytes: u64,
    /// When the last acquisition landed (epoch ms, by its writer's clock): a rate-limited
    /// acquire lands only a spacing after it.
    pub started_at_ms: Option<u64>,
    /// Its operator's configuration (F14), if any: every acquisition and grant lands only on
    /// the configuration it assumed, and takes its terms.
    pub config: Option<LockConfig>,
    /// When each leased holder's lease ends (epoch ms, by the clock of the writer that set it:
    /// its acquire, grant or last heartbeat); a holder without one holds until released (F13).
    pub leases: BTreeMap<Identity, u64>,
    /// A gate lock's released acquisitions (see [`Layout::Gate`]), with when each was released
    /// (by its releaser's clock). Always empty in the item layout, which fences them in
    /// `fences`.
    pub tombstones: BTreeMap<Identity, u64>,
    /// How many hold a slot of a gate lock: stored in the gate, whose holders are items of
    /// their own (a gate read with only some of its holdings still says how many there are).
    /// Always 0 in the item layout, which counts its holder map.
    pub gate_holders: u64,
}

impl SemaphoreItem {
    /// The state of a lock that has never been written: version 0, nothing held.
    pub fn empty(lock: LockName) -> Self {
        Self {
            lock,
            layout: Layout::Item,
            limit: None,
            version: Version(0),
            holders: BTreeMap::new(),
            fences: Fences::default(),
            waiting: 0,
            used: 0,
            rate: None,
            started_at_ms: None,
            held_bytes: 0,
            config: None,
            leases: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            gate_holders: 0,
        }
    }

    /// Whether nothing is held, nobody waits and no released acquisition is remembered: the
    /// only state in which a lock may change [`Layout`] (its holders and fences would otherwise
    /// be left where the new layout does not look).
    pub fn is_idle(&self) -> bool {
        self.holders.is_empty()
            && self.used == 0
            && self.waiting == 0
            && self.tombstones.is_empty()
            && self.fences.is_empty()
    }

    /// Whether `identity`'s acquisition was released (or taken back): fenced by a key in the
    /// item layout, by its tombstone in the gate layout.
    pub fn is_released(&self, identity: &Identity) -> bool {
        match self.layout {
            Layout::Item => self.fences.contains(&FenceKey::acquisition(identity)),
            Layout::Gate => self.tombstones.contains_key(identity),
        }
    }

    /// The tombstones a gate lock may drop now: those released at least a fence window before
    /// the last rotation. Why that is enough: a late attempt of a released acquisition was
    /// requested before the release, so (as for a fence, see [`crate::protocol::Timing`]) a
    /// rotation a window after the release is past its horizon, and the rotation, which never
    /// moves back, refuses it once the tombstone is gone.
    pub fn passed_tombstones(&self, window_ms: u64) -> Vec<(Identity, u64)> {
        let Some(rotated_at) = self.fences.rotated_at_ms else {
            return Vec::new();
        };
        self.tombstones
            .iter()
            .filter(|(_, at)| at.saturating_add(window_ms) <= rotated_at)
            .map(|(identity, at)| (identity.clone(), *at))
            .collect()
    }

    /// The leased holders whose lease ended more than `skew_ms` before `now_ms` (by this
    /// writer's clock): what a writer may take back (F13). Within the skew, a holder whose
    /// clock is behind may still think its lease runs: not yet.
    pub fn expired_leases(&self, now_ms: u64, skew_ms: u64) -> Vec<(Identity, Holding, u64)> {
        self.leases
            .iter()
            .filter(|(_, until)| until.saturating_add(skew_ms) < now_ms)
            .filter_map(|(identity, until)| {
                let holding = self.holders.get(identity)?;
                Some((identity.clone(), *holding, *until))
            })
            .collect()
    }

    /// The sum of the holders' entry bytes, from the holders themselves (the stored
    /// `held_bytes` must equal it).
    pub fn bytes_held(&self) -> u64 {
        self.holders.keys().map(Identity::held_bytes).sum()
    }

    /// Whether the item has room for one more holder of any identity: its entry within the
    /// holders' budget, and neither fence generation past its own (see [`HELD_BYTES_BUDGET`]).
    pub fn has_room(&self) -> bool {
        // A gate lock's holders are items of their own: only its fences stay in the gate.
        (self.layout == Layout::Gate || self.held_bytes <= HELD_BYTES_BUDGET - MAX_HELD_BYTES)
            && self.fences.young.len() <= FENCES_PER_GENERATION
            && self.fences.old.len() <= FENCES_PER_GENERATION
    }

    /// Holders now (whatever their weights).
    pub fn count(&self) -> usize {
        match self.layout {
            Layout::Item => self.holders.len(),
            Layout::Gate => usize::try_from(self.gate_holders).unwrap_or(usize::MAX),
        }
    }

    /// The sum of the held weights, from the holders themselves (the stored `used` must equal
    /// it).
    pub fn weight_held(&self) -> u64 {
        self.holders
            .values()
            .map(|h| u64::from(h.weight.get()))
            .sum()
    }

    /// Whether an acquisition on `terms` fits under its limit now (ignoring the line and the
    /// rate).
    pub fn fits(&self, terms: &Terms) -> bool {
        self.used <= terms.room()
    }

    /// When an acquisition at `rate` may start next (`None`: now).
    pub fn next_start_ms(&self, rate: Option<Rate>) -> Option<u64> {
        Some(self.started_at_ms?.saturating_add(rate?.spacing_ms()))
    }

    pub fn is_fenced(&self, key: &FenceKey) -> bool {
        self.fences.contains(key)
    }

    /// The slots `holder` holds, by acquisition.
    pub fn slots_of<'a>(
        &'a self,
        holder: &'a HolderId,
    ) -> impl Iterator<Item = (&'a Identity, &'a Holding)> + 'a {
        self.holders
            .iter()
            .filter(move |(identity, _)| identity.holder == *holder)
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
        let exec = FenceKey::execution(&h, Run::FIRST);
        let acq = FenceKey::acquisition(&id);
        assert_ne!(exec, acq);
        // A stored fence must mean the same thing to the next release of the code: the value
        // is sha256("execution\0<arn>\0") cut to 8 bytes, as `sha256sum` computes it.
        assert_eq!(exec, FenceKey::execution(&h, Run::FIRST));
        assert_eq!(exec.to_string(), "0fcba051b0804e0d");
    }

    #[test]
    fn a_slot_key_names_its_identity_even_when_the_holder_contains_a_hash() {
        let id = Identity::new(
            HolderId::new("operator#7").unwrap(),
            AcquisitionId::new("a-1").unwrap(),
        );
        assert_eq!(Identity::from_slot_key(&id.slot_key()), Ok(id));
        assert!(Identity::from_slot_key("no-separator").is_err());
        assert!(Identity::from_slot_key("#a-1").is_err());
        assert!(Identity::from_slot_key("exec-1#").is_err());
    }
}
