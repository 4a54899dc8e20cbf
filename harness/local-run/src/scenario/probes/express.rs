//! #27: the Express fragment of docs/using.md and the Distributed Map example, as the stack deploys
//! them, on one lock with the standard fragment's executions: Express executions and a map's
//! Express children poll for their slots (`SemaphoreBusy`, retried) and hold them under leases,
//! in the same line as the parked standard executions. Express executions cannot be described
//! (the local server refuses it, as AWS does), so the lock itself is watched: a raw read every
//! few milliseconds sees who holds and who waits (S1 on every read); the map's success says
//! every child acquired, worked and released (a failed child fails it, as on AWS).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::report::Check;
use local_aws::poller::LockItems;
use local_aws::sfn::{start_execution, status, wait_ended, Client as Sfn};
use local_aws::stack::Machine;

const LOCK: &str = "example-lock";
const LIMIT: u64 = 2;
const EXPRESS: usize = 4;
const ITEMS: usize = 6;
const STANDARD: usize = 2;

/// What the watch of the lock saw.
#[derive(Default)]
struct Watched {
    express: BTreeSet<String>,
    children: BTreeSet<String>,
    standard: BTreeSet<String>,
    most_held: u64,
    most_waiting: u64,
    reads: usize,
    problems: Vec<String>,
}

pub struct Machines<'a> {
    pub express: &'a Machine,
    pub map: &'a Machine,
    pub standard: &'a Machine,
}

pub async fn express_and_map(
    sfn: &Sfn,
    machines: Machines<'_>,
    item: &LockItems,
) -> anyhow::Result<Check> {
    let map = start_execution(
        sfn,
        &machines.map.arn,
        "probe-map",
        &json!({"items": (1..=ITEMS).collect::<Vec<_>>()}),
    )
    .await?;
    for n in 1..=EXPRESS {
        start_execution(
            sfn,
            &machines.express.arn,
            &format!("probe-express-{n}"),
            &json!({"order": n}),
        )
        .await?;
    }
    let mut standard = Vec::new();
    for n in 1..=STANDARD {
        let name = format!("probe-shared-{n}");
        standard
            .push(start_execution(sfn, &machines.standard.arn, &name, &json!({"order": n})).await?);
    }
    let watched = watch(sfn, item, &map, &standard, machines.express, machines.map).await?;
    let mut ended = Vec::new();
    for arn in std::iter::once(&map).chain(&standard) {
        ended.push(wait_ended(sfn, arn, Duration::from_secs(60)).await?.status);
    }
    let after = item.read(LOCK, None).await?;
    let (held_after, waiting_after) = after.map_or((0, 0), |r| (r.holders.len(), r.waiting));
    let ok = ended.iter().all(|s| s == "SUCCEEDED")
        && watched.problems.is_empty()
        && watched.most_held <= LIMIT
        // The map succeeds only if every child did (the local server fails it with
        // States.ExceedToleratedFailureThreshold otherwise, as AWS does): each child acquired,
        // worked and released. The reads may miss a short hold: each kind seen at least once.
        && !watched.express.is_empty()
        && !watched.children.is_empty()
        && !watched.standard.is_empty()
        && watched.most_waiting > 0
        && held_after == 0
        && waiting_after == 0;
    Ok(Check::new(
        "Express and Distributed Map",
        ok,
        format!(
            "{} Express executions of {}, a Distributed Map of {} Express children ({}) and {} \
             standard executions of {} on {LOCK} (limit {LIMIT}) at once: {} raw reads saw {} \
             Express, {} map-child and {} standard holders, at most {} held and {} waiting at \
             once{}; the map and the standard executions ended {}; after: {} held, {} waiting",
            EXPRESS,
            machines.express.name,
            ITEMS,
            machines.map.name,
            STANDARD,
            machines.standard.name,
            watched.reads,
            watched.express.len(),
            watched.children.len(),
            watched.standard.len(),
            watched.most_held,
            watched.most_waiting,
            if watched.problems.is_empty() {
                String::new()
            } else {
                format!(", problems: {}", watched.problems.join("; "))
            },
            ended.join("/"),
            held_after,
            waiting_after
        ),
    ))
}

/// Reads the lock until the map and the standard executions have ended and nobody holds or
/// waits (or a minute passed): every holder seen, by kind, and the most held and waiting.
async fn watch(
    sfn: &Sfn,
    item: &LockItems,
    map: &str,
    standard: &[String],
    express: &Machine,
    map_machine: &Machine,
) -> anyhow::Result<Watched> {
    let mut seen = Watched::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next_status = Instant::now();
    let mut running = true;
    while Instant::now() < deadline {
        if let Some(r) = item.read(LOCK, Some(LIMIT as u32)).await? {
            seen.reads += 1;
            if let Some(problem) = r.problem {
                seen.problems.push(problem);
            }
            seen.most_held = seen.most_held.max(r.weight_held);
            seen.most_waiting = seen.most_waiting.max(r.waiting);
            let idle = r.holders.is_empty() && r.waiting == 0;
            for holder in r.holders {
                // A map child is an execution of `<map machine>/<map run>`.
                if holder.contains(&format!(":{}/", map_machine.name)) {
                    seen.children.insert(holder);
                } else if holder.contains(&format!(":{}:", express.name)) {
                    seen.express.insert(holder);
                } else {
                    seen.standard.insert(holder);
                }
            }
            if !running && idle {
                break;
            }
        }
        if Instant::now() >= next_status {
            next_status = Instant::now() + Duration::from_millis(500);
            let mut still = false;
            for arn in std::iter::once(map).chain(standard.iter().map(String::as_str)) {
                still |= status(sfn, arn).await.as_deref() == Some("RUNNING");
            }
            running = still;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(seen)
}
