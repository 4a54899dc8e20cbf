//! The fence rotation rule as the bench predicts it, kept apart from the core (`protocol::rotation`
//! and `busy_rotation`, `Semaphore::release`/`cleanup`/`sweep`) so that a change on either side
//! shows up as a disagreement:
//!
//! - a fencing write (release, cleanup) adds one fence to the young generation; then the same
//!   caller rotates if a rotation is *due* (a window has passed since the last rotation, or there
//!   was none) and the young generation, its own fence added, holds at least
//!   [`BUSY_YOUNG_FENCES`] fences;
//! - the sweeper rotates any lock whose scanned item has a fence and is due, whatever the count;
//! - a rotation moves young to old and drops old.
//!
//! The bench's Semaphores are built as the Lambdas build them, so the threshold is the core's
//! default.

pub use semaphore_core::protocol::BUSY_YOUNG_FENCES;

/// One lock's fences under the rule, for fencing writes made one at a time (no two writers
/// racing): what is stored, and how many rotations the writers made.
#[derive(Debug, Clone)]
pub struct FenceModel {
    window_ms: u64,
    busy: usize,
    pub young: usize,
    pub old: usize,
    pub last: Option<u64>,
    pub rotations: u64,
    /// The most fences stored after any write: the fencing write's own, before the rotation it
    /// may make (the item is then at its largest).
    pub max_fences: usize,
}

impl FenceModel {
    pub fn new(window_ms: u64, busy: usize) -> Self {
        Self {
            window_ms,
            busy: busy.max(1),
            young: 0,
            old: 0,
            last: None,
            rotations: 0,
            max_fences: 0,
        }
    }

    fn due(&self, now_ms: u64) -> bool {
        self.last
            .is_none_or(|last| now_ms >= last.saturating_add(self.window_ms))
    }

    fn rotate(&mut self, now_ms: u64) {
        self.old = std::mem::take(&mut self.young);
        self.last = Some(now_ms);
        self.rotations += 1;
    }

    /// A release or cleanup at `now_ms` (a new fence): whether it rotated.
    pub fn fenced(&mut self, now_ms: u64) -> bool {
        self.young += 1;
        self.max_fences = self.max_fences.max(self.young + self.old);
        let rotates = self.young >= self.busy && self.due(now_ms);
        if rotates {
            self.rotate(now_ms);
        }
        rotates
    }
}

/// The most fences a lock's item carries at `rate` fencing writes per second, evenly spaced, at
/// window `W`, by writers alone: a writer's rotation takes the young generation as it is, and
/// happens at the first fencing write that finds a rotation due with at least `busy` young
/// fences. If the young generation has reached `busy` by then, it holds the writes of one window
/// and the one that found it due (at most `rate x W + 1`); otherwise exactly `busy`. So each
/// generation holds at most `max(busy, rate x W + 1)`, and the item, just after the write that
/// completes a generation and before its rotation, twice that. A quiet lock (under one write per
/// window) reaches exactly `2 x busy` from its `2 x busy`-th fencing write on: every write finds a
/// rotation due, and each generation is exactly `busy`.
pub fn worst_fences(rate: f64, window_s: f64, busy: usize) -> f64 {
    2.0 * (busy as f64).max(rate * window_s + 1.0)
}

/// The writers' rotations that `fencing_writes` releases or cleanups of one lock, made one at a
/// time over `seconds` (real clock) starting from `young` young fences and no rotation, may make:
/// none until the young generation reaches `busy` (that write rotates: there was no rotation),
/// then at most one per window and one per `busy` more fencing writes.
pub fn rotations_between(
    young: usize,
    fencing_writes: usize,
    seconds: f64,
    window_s: f64,
    busy: usize,
) -> (u64, u64) {
    let busy = busy.max(1);
    let fences = young + fencing_writes;
    if fences < busy {
        return (0, 0);
    }
    let per_window = 1 + (seconds / window_s).floor() as u64;
    let per_fences = 1 + ((fences - busy) / busy) as u64;
    (1, per_window.min(per_fences))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_rotates_when_due_and_busy() {
        let mut f = FenceModel::new(10, 8);
        for t in 0..7 {
            assert!(!f.fenced(t));
        }
        assert_eq!((f.young, f.old, f.rotations), (7, 0, 0));
        assert!(f.fenced(7), "8 young fences, never rotated");
        assert_eq!((f.young, f.old, f.rotations, f.max_fences), (0, 8, 1, 8));
        for t in 8..17 {
            assert!(!f.fenced(t), "less than a window at {t}");
        }
        assert!(f.fenced(17), "a window later, 10 young");
        assert_eq!((f.young, f.old, f.rotations, f.max_fences), (0, 10, 2, 18));
        // Quiet: every write is due, a generation is 8 fences, the item carries up to 16.
        let mut q = FenceModel::new(10, 8);
        for n in 0..40 {
            q.fenced(n * 60);
        }
        assert_eq!((q.young, q.old, q.rotations, q.max_fences), (0, 8, 5, 16));
        assert_eq!(worst_fences(1.0 / 60.0, 10.0, 8), 16.0);
        // Threshold 1 is the old rule: rotate at every write that finds a rotation due.
        let mut one = FenceModel::new(10, 1);
        assert!(one.fenced(0));
        assert_eq!((one.young, one.old), (0, 1));
    }

    #[test]
    fn the_worst_case_bounds_the_rule_at_every_rate() {
        for (spacing_ms, busy) in [(60_000, 8), (10_000, 8), (1_300, 8), (700, 8), (100, 8)]
            .into_iter()
            .chain([(100, 1), (60_000, 1), (250, 3)])
        {
            let mut f = FenceModel::new(10_000, busy);
            for n in 0..2_000 {
                f.fenced(n * spacing_ms);
            }
            let rate = 1_000.0 / spacing_ms as f64;
            assert!(
                f.max_fences as f64 <= worst_fences(rate, 10.0, busy),
                "{spacing_ms} ms, {busy}: {} fences",
                f.max_fences
            );
            let seconds = (2_000 * spacing_ms) as f64 / 1_000.0;
            let (least, most) = rotations_between(0, 2_000, seconds, 10.0, busy);
            assert!(
                (least..=most).contains(&f.rotations),
                "{spacing_ms}, {busy}"
            );
        }
        assert_eq!(rotations_between(0, 7, 0.1, 10.0, 8), (0, 0));
        assert_eq!(rotations_between(0, 10, 0.1, 10.0, 8), (1, 1));
        assert_eq!(rotations_between(0, 100, 3.0, 10.0, 8), (1, 1));
        assert_eq!(rotations_between(0, 100, 30.0, 10.0, 8), (1, 4));
        assert_eq!(rotations_between(1, 15, 30.0, 10.0, 8), (1, 2));
    }
}
