//! The original AWS sample's protocol ("control concurrency with DynamoDB", 2021), as a
//! reference the checker must find the seed race in. (The same protocol runs against the local
//! server in `harness/local-aws/src/sample.rs`.)
//!
//! One item per lock, created up front with `count = 0`: a counter plus one attribute per
//! holding execution. Acquire is one `UpdateItem` `SET count = count + 1, holder:<exec>`
//! conditioned on `count < limit AND attribute_not_exists(holder:<exec>)`; when the condition
//! fails the state machine reads the item to see whether the execution already holds it, and
//! otherwise waits and tries again. Release is one `UpdateItem` `SET count = count - 1 REMOVE
//! holder:<exec>` conditioned on `attribute_exists(holder:<exec>)`. Cleanup reads the item and,
//! if the execution is a holder, sends the release update. No version, no fence, no sweeper.

use crate::hash::hash_one;
use crate::plumbing::{exec_name, say};
use crate::world::{slot_bit, Advance, Answer, Next, Op, OpKind, Protocol, MAX_EXECUTIONS};

/// The sample's item: its counter and its holder attributes (bit i: `holder:exec-(i+1)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleItem {
    pub count: i8,
    pub holders: u32,
}

/// Where one call of the sample is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SamplePhase {
    /// The acquire `UpdateItem` is in flight.
    AcquireUpdate,
    /// The acquire's condition failed: about to read whether the execution already holds.
    CheckHeld,
    /// The release `UpdateItem` is in flight.
    ReleaseUpdate,
    /// Cleanup, about to read the item.
    CleanupRead,
    /// Cleanup's release `UpdateItem` is in flight.
    CleanupUpdate,
}

/// The AWS sample's protocol.
pub struct Sample {
    limit: u32,
}

impl Sample {
    pub fn new(limit: u32) -> Self {
        Self { limit }
    }

    fn show(item: SampleItem) -> String {
        let holders: Vec<String> = (0..32u8)
            .filter(|e| item.holders & (1 << e) != 0)
            .map(|e| format!("holder:{}", exec_name(e)))
            .collect();
        if holders.is_empty() {
            format!("count {}, no holder attributes", item.count)
        } else {
            format!("count {}, {}", item.count, holders.join(", "))
        }
    }

    /// The release `UpdateItem`, landing.
    fn release_update(
        item: SampleItem,
        bit: u32,
        name: &str,
        log: Option<&mut String>,
    ) -> Advance<SampleItem, SamplePhase> {
        let held = item.holders & bit != 0;
        let after = if held {
            SampleItem {
                count: item.count - 1,
                holders: item.holders & !bit,
            }
        } else {
            item
        };
        if let Some(log) = log {
            if held {
                log.push_str(&format!(
                    "UpdateItem (release if holder:{name} exists) lands: {}",
                    Self::show(after)
                ));
            } else {
                log.push_str(&format!(
                    "UpdateItem (release if holder:{name} exists) fails its condition ({}): \
                     nothing to release",
                    Self::show(item)
                ));
            }
        }
        Advance {
            store: Some(after),
            wrote: held,
            next: Next::Finished(Answer::Done),
        }
    }
}

impl Protocol for Sample {
    type Item = SampleItem;
    type Phase = SamplePhase;

    fn name(&self) -> &'static str {
        "the AWS sample's protocol (counter + holder attributes, no version, no fence)"
    }

    fn initial_item(&self) -> Option<SampleItem> {
        Some(SampleItem {
            count: 0,
            holders: 0,
        })
    }

    fn start(&self, op: Op, _requested: u8) -> SamplePhase {
        match op.kind {
            OpKind::Acquire => SamplePhase::AcquireUpdate,
            // The sample's release names a holder and frees it, whoever sends it.
            OpKind::Release | OpKind::StrayRelease => SamplePhase::ReleaseUpdate,
            OpKind::Cleanup => SamplePhase::CleanupRead,
        }
    }

    fn describe_start(&self, op: Op) -> String {
        match op.kind {
            OpKind::Acquire => format!(
                "sends UpdateItem: take a slot if count < {} and no holder attribute of its own \
                 [in flight]",
                self.limit
            ),
            OpKind::Release | OpKind::StrayRelease => {
                "sends UpdateItem: release if its holder attribute exists [in flight]".to_owned()
            }
            OpKind::Cleanup => "about to read the item".to_owned(),
        }
    }

    fn in_flight(&self, phase: SamplePhase) -> bool {
        matches!(
            phase,
            SamplePhase::AcquireUpdate | SamplePhase::ReleaseUpdate | SamplePhase::CleanupUpdate
        )
    }

    fn advance(
        &self,
        op: Op,
        phase: SamplePhase,
        store: Option<SampleItem>,
        _now: u8,
        _running: bool,
        log: Option<&mut String>,
    ) -> Advance<SampleItem, SamplePhase> {
        let item = store.expect("the sample creates the item up front");
        let bit = 1u32 << op.exec;
        let name = exec_name(op.exec);
        let held = item.holders & bit != 0;
        let unchanged = |next| Advance {
            store,
            wrote: false,
            next,
        };
        match phase {
            SamplePhase::AcquireUpdate => {
                if i64::from(item.count) < i64::from(self.limit) && !held {
                    let after = SampleItem {
                        count: item.count + 1,
                        holders: item.holders | bit,
                    };
                    say(log, || {
                        format!("UpdateItem (take a slot) lands: {}", Self::show(after))
                    });
                    Advance {
                        store: Some(after),
                        wrote: true,
                        next: Next::Finished(Answer::Acquired),
                    }
                } else {
                    say(log, || {
                        format!(
                            "UpdateItem (take a slot) fails its condition ({}) -> will read \
                             whether {name} already holds",
                            Self::show(item)
                        )
                    });
                    unchanged(Next::Continue(SamplePhase::CheckHeld))
                }
            }
            SamplePhase::CheckHeld => {
                say(log, || {
                    format!(
                        "reads the item ({}): {}",
                        Self::show(item),
                        if held {
                            "already a holder -> acquired"
                        } else {
                            "not a holder -> full"
                        }
                    )
                });
                unchanged(Next::Finished(if held {
                    Answer::Acquired
                } else {
                    Answer::Full
                }))
            }
            SamplePhase::ReleaseUpdate | SamplePhase::CleanupUpdate => {
                Self::release_update(item, bit, &name, log)
            }
            SamplePhase::CleanupRead => {
                say(log, || {
                    format!(
                        "reads the item ({}): {}",
                        Self::show(item),
                        if held {
                            format!("{name} holds a slot -> sends UpdateItem: release if holder:{name} exists [in flight]")
                        } else {
                            format!("{name} holds nothing -> nothing to do")
                        }
                    )
                });
                unchanged(if held {
                    Next::Continue(SamplePhase::CleanupUpdate)
                } else {
                    Next::Finished(Answer::Done)
                })
            }
        }
    }

    /// One holder attribute per execution: its first acquisition's slot, in the world's terms
    /// (the sample runs in worlds without redrives).
    fn holders(&self, store: Option<SampleItem>) -> u32 {
        let holders = store.map_or(0, |i| i.holders);
        (0..MAX_EXECUTIONS as u8)
            .filter(|e| holders & (1 << e) != 0)
            .fold(0, |m, e| m | slot_bit(e, 0))
    }

    fn acquisition_of(&self, _inc: u8) -> u8 {
        0
    }

    /// The sample's state machine has no guard: a redrive into the work runs it again (F7).
    fn guards_redriven_work(&self) -> bool {
        false
    }

    /// The count: every acquisition here is of weight 1.
    fn stored_used(&self, store: Option<SampleItem>) -> i64 {
        store.map_or(0, |i| i64::from(i.count))
    }

    fn describe(&self, store: Option<SampleItem>) -> String {
        store.map_or_else(|| "no item".to_owned(), Self::show)
    }

    fn item_key(&self, store: Option<SampleItem>) -> u64 {
        hash_one(&store.map(|i| i.count))
    }

    fn item_exec_key(&self, store: Option<SampleItem>, e: u8) -> u64 {
        u64::from(store.is_some_and(|i| i.holders & (1 << e) != 0))
    }

    fn phase_key(&self, _: Op, phase: SamplePhase) -> u64 {
        phase as u64
    }
}
