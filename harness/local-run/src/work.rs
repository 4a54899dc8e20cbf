//! The work under the lock: the lock-protected machine runs the demo work as a child execution
//! (`startExecution.sync:2`). Besides the locks, the run checks that every child ended while its
//! parent held its slot (a stopped parent's child included: moto, like AWS when its best-effort
//! stop fails, lets it run on, so the cleanup must stop it before it frees the slot).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use serde_json::Value;

use crate::driver::Planned;
use crate::report::{short, WorkReport};
use crate::{LockSpec, Role};
use local_aws::poller::PollStats;
use local_aws::sfn::{describe, json_of, list_executions, Client as Sfn};
use local_aws::stack::Machine;

/// A child execution of the work machine, and the lock-protected execution that started it
/// (the holder its input's semaphore context names).
#[derive(Debug, Clone)]
pub struct Child {
    pub arn: String,
    pub parent: Option<String>,
    pub status: String,
    /// `None` while it runs.
    pub stop_ms: Option<i64>,
}

/// Every execution of `machine`, with the parent its input names.
pub async fn children(sfn: &Sfn, machine: &str) -> anyhow::Result<Vec<Child>> {
    let mut out = Vec::new();
    for (arn, _, _) in list_executions(sfn, machine).await? {
        let ended = describe(sfn, &arn).await?;
        let input = json_of(ended.input.as_deref());
        out.push(Child {
            arn,
            parent: input["semaphore"]["holder"].as_str().map(str::to_owned),
            stop_ms: (ended.status != "RUNNING").then_some(ended.stop_ms),
            status: ended.status,
        });
    }
    Ok(out)
}

/// The lock-protected machine's work state: the one that starts the child execution. Read from
/// the definition, so that a renamed state is still found.
pub fn work_state(protected: &Machine) -> anyhow::Result<String> {
    let definition: Value = serde_json::from_str(&protected.definition)
        .with_context(|| format!("{} is not JSON", protected.definition_uri))?;
    definition["States"]
        .as_object()
        .and_then(|states| {
            states.iter().find(|(_, s)| {
                s["Resource"]
                    .as_str()
                    .is_some_and(|r| r.contains(":states:startExecution"))
            })
        })
        .map(|(name, _)| name.clone())
        .with_context(|| {
            format!(
                "{} has no state that starts a child execution",
                protected.definition_uri
            )
        })
}

/// Every child against its parent's slot, as the poller saw it: a child must have ended
/// before the first read that no longer saw its parent holding (or its parent still held at
/// the end). `stopped` are the parents the run stopped, `swept` the holders whose slot a sweep
/// reclaimed.
#[allow(clippy::too_many_arguments)]
pub fn report(
    work: &Machine,
    children: &[Child],
    planned: &[Planned],
    locks: &[LockSpec],
    stopped: &BTreeMap<String, Role>,
    parent_status: &BTreeMap<String, String>,
    poll: &PollStats,
    swept: &BTreeSet<String>,
) -> WorkReport {
    let lock_of: BTreeMap<&str, &str> = planned
        .iter()
        .map(|p| (p.arn.as_str(), locks[p.lock].name.as_str()))
        .collect();
    let mut out = WorkReport {
        machine: work.name.clone(),
        ..WorkReport::default()
    };
    let mut child_of: BTreeMap<&str, &Child> = BTreeMap::new();
    for child in children {
        // The probes' children, and the child run first for the redrive guard, are not the
        // run's executions.
        let Some(parent) = child.parent.as_deref().filter(|p| lock_of.contains_key(p)) else {
            continue;
        };
        child_of.insert(parent, child);
        out.children += 1;
        let seen = poll.last_seen_ms.contains_key(parent);
        let freed = poll.gone_ms.get(parent).copied();
        let verdict = match (child.stop_ms, freed) {
            (_, _) if !seen => Err("its parent was never seen holding a slot".to_owned()),
            (Some(stop), Some(freed)) if stop <= freed => Ok(Some(freed - stop)),
            (Some(stop), Some(freed)) => Err(format!(
                "it ended {} ms after its parent's slot was freed",
                stop - freed
            )),
            // The parent still holds: a leak the lock's S2 check reports.
            (Some(_), None) => Ok(None),
            (None, Some(_)) => Err("still RUNNING, its parent's slot freed".to_owned()),
            (None, None) => Err("still RUNNING at the end".to_owned()),
        };
        match verdict {
            Ok(margin) => {
                out.ended_under_the_slot += 1;
                if let Some(m) = margin {
                    out.min_margin_ms = Some(out.min_margin_ms.map_or(m, |x: i64| x.min(m)));
                }
            }
            Err(why) => out.violations.push(format!(
                "{} (child of {}): {why}",
                short(&child.arn),
                short(parent)
            )),
        }
    }
    for p in planned
        .iter()
        .filter(|p| stopped.get(&p.arn) == Some(&Role::StopMidWork))
    {
        let status = parent_status.get(&p.arn).map_or("?", String::as_str);
        if status != "ABORTED" {
            // The stop came after the work: nothing ran without the slot.
            continue;
        }
        let lock = locks[p.lock].name.as_str();
        let by = if swept.contains(&p.arn) {
            "a sweep"
        } else {
            "the cleanup"
        };
        let line = match child_of.get(p.arn.as_str()) {
            None => format!("{} ({lock}): stopped before its child started", p.name),
            Some(child) => {
                let ended = if child.status == "ABORTED" {
                    out.children_stopped += 1;
                    "was stopped"
                } else {
                    out.children_ended_on_their_own += 1;
                    "ended on its own"
                };
                match (child.stop_ms, poll.gone_ms.get(&p.arn)) {
                    (Some(stop), Some(freed)) => format!(
                        "{} ({lock}): its child {} {} ({}), {} ms before {by} freed the slot",
                        p.name,
                        short(&child.arn),
                        ended,
                        child.status,
                        freed - stop
                    ),
                    _ => format!(
                        "{} ({lock}): its child {} is {}, the slot {}",
                        p.name,
                        short(&child.arn),
                        child.status,
                        if poll.gone_ms.contains_key(&p.arn) {
                            "freed"
                        } else {
                            "still held"
                        }
                    ),
                }
            }
        };
        out.stopped_parents.push(line);
    }
    out
}
