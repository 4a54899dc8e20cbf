//! The commands, each run against the table (and Step Functions, for `sweep`).
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use lambda_common::HandOffs;
use lambda_sweeper::{ArnPatterns, SfnExecutions};
use semaphore_core::{
    rfc3339_millis, terms_on, AcquireOutcome, DynamoStore, HeartbeatOutcome, HolderId, Rate,
    Reclaimed, ReleaseOutcome, Run, Semaphore, TableSetup, Timing,
};
use serde_json::{json, Value};

use crate::cli::{Cli, Request};
use crate::output::{
    acting_as, cleaned_json, config_json, merge, status_json, unreadable_lock, Answer, Failure,
    EXIT_EXPIRED, EXIT_FENCED, EXIT_FULL, EXIT_WRONG_TOKEN,
};
use crate::top;

pub(crate) async fn run(cli: Cli, requested_at_ms: u64) -> Result<Answer, Failure> {
    // Validate everything before building a client, so bad input never reaches the table.
    let request = Request::parse(cli.command)?;
    // Throttles and lost answers are retried longer than the SDK's three attempts: every
    // command is safe to send again (it reads its own answer from the lock, F10), and a person
    // at a terminal would rather wait a few seconds than retry by hand.
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(semaphore_core::dynamo::holder_retries(cli.max_attempts));
    if let Some(url) = &cli.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    if let Some(region) = cli.region {
        loader = loader.region(aws_config::Region::new(region));
    }
    let config = loader.load().await;
    if config.region().is_none() {
        return Err(Failure::NoRegion);
    }
    let mut store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), &cli.table);
    if let Some(queue_table) = &cli.queue_table {
        store = store.with_queue_table(queue_table);
    }
    if let Some(holdings_table) = &cli.holdings_table {
        store = store.with_holdings_table(holdings_table);
    }
    let semaphore = Semaphore::new(store).with_timing(Timing {
        horizon: Duration::from_secs(cli.horizon_seconds),
        clock_skew: Duration::from_secs(cli.clock_skew_seconds),
    });
    request.execute(&semaphore, &config, requested_at_ms).await
}

impl Request {
    pub(crate) async fn execute(
        self,
        semaphore: &Semaphore<DynamoStore>,
        sdk: &SdkConfig,
        requested_at_ms: u64,
    ) -> Result<Answer, Failure> {
        Ok(match self {
            Self::Init => {
                let table = semaphore.store().table();
                let outcome = match semaphore.store().create_table().await? {
                    TableSetup::Created => "created",
                    TableSetup::AlreadyExisted => "already_existed",
                };
                Answer::done(json!({"table": table, "outcome": outcome}))
            }
            Self::Acquire(lock, identity, asked) => {
                let (outcome, seen) = semaphore
                    .acquire_seeing(&lock, &identity, Run::FIRST, asked, requested_at_ms)
                    .await?;
                // On a configured lock, its operator's terms (F14), not the ones asked for.
                let config = seen.as_ref().and_then(|item| item.config);
                let terms = terms_on(config.as_ref(), &lock, asked)?;
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                    "limit": terms.limit.get(),
                    "weight": terms.weight.get(),
                    "rate": terms.rate.map(Rate::as_per_second),
                    "configured": config.is_some(),
                    // F13: when the slot's lease ends (null: none, or nothing held).
                    "lease_until": seen
                        .as_ref()
                        .and_then(|item| item.leases.get(&identity))
                        .map(|until| rfc3339_millis(*until)),
                });
                let (fields, code) = match outcome {
                    AcquireOutcome::Acquired { token, count } => (
                        json!({"outcome": "acquired", "token": token.0, "count": count}),
                        0,
                    ),
                    AcquireOutcome::AlreadyHeld { token, count } => (
                        json!({"outcome": "already_held", "token": token.0, "count": count}),
                        0,
                    ),
                    AcquireOutcome::Full { count, used, limit } => (
                        json!({
                            "outcome": "full",
                            "count": count,
                            "used": used,
                            "message": format!(
                                "{used} of {limit} held, or others wait in line: weight {} \
                                 does not fit now; nothing was taken",
                                terms.weight
                            ),
                        }),
                        EXIT_FULL,
                    ),
                    AcquireOutcome::RateLimited { next_start_ms } => (
                        json!({
                            "outcome": "rate_limited",
                            "next_start_at": rfc3339_millis(next_start_ms),
                            "next_start_at_ms": next_start_ms,
                            "message": format!(
                                "the start rate{} is spent: the next acquisition may start at \
                                 {} (in {} ms); nothing was taken",
                                terms.rate.map_or(String::new(), |rate| format!(" ({rate})")),
                                rfc3339_millis(next_start_ms),
                                next_start_ms.saturating_sub(semaphore.now_ms())
                            ),
                        }),
                        EXIT_FULL,
                    ),
                    AcquireOutcome::Fenced(reason) => (
                        json!({"outcome": "fenced", "reason": reason.describe()}),
                        EXIT_FENCED,
                    ),
                    AcquireOutcome::Configured(_) => {
                        return Err(Failure::Changing {
                            lock: lock.to_string(),
                        })
                    }
                    AcquireOutcome::Expired => (
                        json!({
                            "outcome": "expired",
                            "message": format!(
                                "the request is older than the acquire horizon ({} s) and the \
                                 fences rotated since: nothing was taken; run the command again",
                                semaphore.timing().horizon.as_secs()
                            ),
                        }),
                        EXIT_EXPIRED,
                    ),
                };
                merge(&mut out, fields);
                Answer::exit(out, code)
            }
            Self::Release(lock, identity, claim) => {
                // A wrong weight costs one write more: the core finds the slot's own.
                let (outcome, after) = semaphore.release_seeing(&lock, &identity, claim).await?;
                let waiting = after.waiting;
                let used = after.used;
                // Someone waits in line: the freed slot goes to the head, as a release by the
                // state machine hands it on (nobody waiting: no request).
                let sfn = aws_sdk_sfn::Client::new(sdk);
                let handed_off = HandOffs::new(
                    sfn.clone(),
                    SfnExecutions::of_machines(sfn, ArnPatterns::default()),
                )
                .run(semaphore, &lock, Some(after))
                .await
                .woken
                .len();
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                    "waiting": waiting,
                    // The sum of the weights held after the release (before any hand-off).
                    "used": used,
                    "handed_off": handed_off,
                });
                merge(
                    &mut out,
                    match outcome {
                        ReleaseOutcome::Released { token, count, .. } => {
                            json!({"outcome": "released", "token": token.map(|t| t.0), "count": count})
                        }
                        ReleaseOutcome::NotHeld { count, .. } => json!({
                            "outcome": "not_held",
                            "count": count,
                            "message": format!("{} held nothing on {lock}; nothing to release", identity.slot_key()),
                        }),
                        ReleaseOutcome::WrongToken { held, count, .. } => {
                            merge(&mut out, acting_as(claim));
                            merge(
                                &mut out,
                                json!({
                                    "outcome": "wrong_token",
                                    "held_token": held.0,
                                    "count": count,
                                    "message": format!(
                                        "{} holds its slot on {lock} under token {}, not the one \
                                         shown: nothing was released; pass the token its \
                                         acquire answered",
                                        identity.slot_key(),
                                        held.0
                                    ),
                                }),
                            );
                            return Ok(Answer::exit(out, EXIT_WRONG_TOKEN));
                        }
                    },
                );
                merge(&mut out, acting_as(claim));
                Answer::done(out)
            }
            Self::ReleaseAllOf(holder, Some(lock)) => {
                // One lock, named: the same as `cleanup`, also when it holds nothing there (the
                // fence still stops a late acquire of it).
                let outcome = semaphore.cleanup(&lock, &holder).await?;
                let cleaned = cleaned_json(&lock, &outcome, semaphore.now_ms());
                Answer::done(json!({
                    "holder": holder.as_str(),
                    "outcome": "cleaned",
                    "locks": [cleaned],
                    "errors": [],
                }))
            }
            Self::ReleaseAllOf(holder, None) => release_everywhere(semaphore, &holder).await?,
            Self::Cleanup(lock, holder) => {
                let outcome = semaphore.cleanup(&lock, &holder).await?;
                let mut out = cleaned_json(&lock, &outcome, semaphore.now_ms());
                merge(
                    &mut out,
                    json!({"holder": holder.as_str(), "outcome": "cleaned"}),
                );
                Answer::done(out)
            }
            Self::Heartbeat(lock, identity, claim, lease) => {
                let outcome = semaphore.heartbeat(&lock, &identity, claim, lease).await?;
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                });
                merge(&mut out, acting_as(claim));
                match outcome {
                    HeartbeatOutcome::Renewed { until_ms } => {
                        merge(
                            &mut out,
                            json!({"outcome": "renewed", "lease_until": rfc3339_millis(until_ms), "lease_until_ms": until_ms}),
                        );
                        Answer::done(out)
                    }
                    HeartbeatOutcome::Lost => {
                        merge(
                            &mut out,
                            json!({
                                "outcome": "lost",
                                "message": "the slot is not held any more (its lease passed and it \
                                            was taken back, or it was released or cleaned up): \
                                            stop using it; a new acquire needs a new acquisition id",
                            }),
                        );
                        Answer::exit(out, EXIT_FENCED)
                    }
                    HeartbeatOutcome::WrongToken { held } => {
                        merge(
                            &mut out,
                            json!({
                                "outcome": "wrong_token",
                                "held_token": held.0,
                                "message": "the acquisition holds its slot under another token \
                                            than --token: nothing was renewed",
                            }),
                        );
                        Answer::exit(out, EXIT_WRONG_TOKEN)
                    }
                }
            }
            Self::Configure(lock, config) => {
                let item = semaphore.configure(&lock, config).await?;
                Answer::done(config_json(&lock, Some(&item)))
            }
            Self::Lay(lock, layout, config) => {
                semaphore.set_layout(&lock, layout).await?;
                let item = semaphore.configure(&lock, Some(config)).await?;
                Answer::done(config_json(&lock, Some(&item)))
            }
            Self::ShowConfig(lock) => {
                let item = match semaphore.status(&lock).await {
                    Ok(item) => Some(item),
                    Err(semaphore_core::Error::UnknownLock { .. }) => None,
                    Err(e) => return Err(e.into()),
                };
                Answer::done(config_json(&lock, item.as_ref()))
            }
            Self::Status(lock, shown) => {
                let item = semaphore.status(&lock).await?;
                Answer::done(status_json(
                    &item,
                    semaphore.now_ms(),
                    &semaphore.timing(),
                    shown,
                ))
            }
            Self::List(shown) => list(semaphore, shown).await?,
            Self::Top(options) => Answer::printed(top::run(semaphore, &options).await?),
            Self::Sweep {
                dry_run,
                state_machines,
            } => {
                let executions =
                    SfnExecutions::of_machines(aws_sdk_sfn::Client::new(sdk), state_machines);
                sweep(semaphore, &executions, dry_run).await?
            }
        })
    }
}

pub(crate) async fn list(
    semaphore: &Semaphore<DynamoStore>,
    shown: usize,
) -> Result<Answer, Failure> {
    let now = semaphore.now_ms();
    let timing = semaphore.timing();
    let mut entries: Vec<(Option<String>, Value)> = Vec::new();
    let mut errors = Vec::new();
    for item in semaphore.list().await? {
        match item {
            Ok(item) => entries.push((
                Some(item.lock.to_string()),
                status_json(&item, now, &timing, shown),
            )),
            Err(e) => {
                let lock = unreadable_lock(&e).map(str::to_owned);
                entries.push((lock.clone(), json!({"lock": lock, "error": e.to_string()})));
                errors.push(e.to_string());
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let output = Value::Array(entries.into_iter().map(|(_, entry)| entry).collect());
    Ok(Answer::unless_errors(
        output,
        &errors,
        "some items could not be read; the other locks are listed",
    ))
}

/// Fences `holder` and frees its slots on every lock that holds it now, found by a scan. A lock
/// that fails goes into "errors" and the others are still done (like the cleanup function):
/// an operator freeing an execution's slots wants every slot it can get back.
pub(crate) async fn release_everywhere(
    semaphore: &Semaphore<DynamoStore>,
    holder: &HolderId,
) -> Result<Answer, Failure> {
    let mut errors = Vec::new();
    let mut locks = Vec::new();
    for item in semaphore.list().await? {
        match item {
            Ok(item) if item.slots_of(holder).next().is_some() => locks.push(item.lock),
            Ok(_) => {}
            // It may hold a slot there, which this semaphore cannot free: say so.
            Err(e) => errors.push(e.to_string()),
        }
    }
    locks.sort();
    let mut cleaned = Vec::with_capacity(locks.len());
    for lock in &locks {
        match semaphore.cleanup(lock, holder).await {
            Ok(outcome) => cleaned.push(cleaned_json(lock, &outcome, semaphore.now_ms())),
            Err(e) => errors.push(format!("lock \"{lock}\": {e}")),
        }
    }
    let mut output = json!({
        "holder": holder.as_str(),
        "outcome": "cleaned",
        "locks": cleaned,
        "errors": errors,
    });
    if locks.is_empty() {
        merge(
            &mut output,
            json!({"message": format!("{holder} holds no slot on any lock: nothing written")}),
        );
    }
    Ok(Answer::unless_errors(
        output,
        &errors,
        "some locks could not be read or cleaned; the others were",
    ))
}

pub(crate) async fn sweep(
    semaphore: &Semaphore<DynamoStore>,
    executions: &SfnExecutions,
    dry_run: bool,
) -> Result<Answer, Failure> {
    let report = if dry_run {
        semaphore.sweep_dry_run(executions).await?
    } else {
        semaphore.sweep(executions).await?
    };
    let mut slots: Vec<&Reclaimed> = report.reclaimed.iter().collect();
    slots.sort_by(|a, b| {
        (&a.lock, &a.holder, &a.acquisition).cmp(&(&b.lock, &b.holder, &b.acquisition))
    });
    let slots: Vec<Value> = slots
        .into_iter()
        .map(|slot| {
            json!({
                "lock": slot.lock.as_str(),
                "holder": slot.holder.as_str(),
                "acquisition": slot.acquisition.as_str(),
                "token": slot.token.0,
                "held_for_ms": slot.held_for_ms,
                "reason": slot.reason,
            })
        })
        .collect();
    let mut output = json!({
        "dry_run": dry_run,
        "locks": report.locks,
        "holders_checked": report.holders_checked,
        "largest_item": report.largest_item.as_ref().map(|largest| json!({
            "lock": largest.lock.as_str(),
            "bytes": largest.bytes,
        })),
        // Not found, but acquired within the grace period (DescribeExecution is eventually
        // consistent): kept, a later sweep asks again.
        "kept_not_found": report.too_young.iter().map(|(lock, holder)| json!({
            "lock": lock.as_str(),
            "holder": holder.as_str(),
        })).collect::<Vec<_>>(),
        "errors": report.errors,
    });
    // Distinct keys, so that a dry run's output is never read as slots taken back.
    let fields = if dry_run {
        json!({"would_reclaim": slots})
    } else {
        json!({
            "reclaimed": slots,
            "rotated": report.rotated,
            // F13: leases that passed unrenewed, whoever held them; each fenced.
            "taken_back": semaphore.drain_taken_back().iter().map(|slot| json!({
                "lock": slot.lock.as_str(),
                "holder": slot.identity.holder.as_str(),
                "acquisition": slot.identity.acquisition.as_str(),
                "token": slot.holding.token.0,
                "weight": slot.holding.weight.get(),
                "lease_until": rfc3339_millis(slot.lease_until_ms),
            })).collect::<Vec<_>>(),
        })
    };
    merge(&mut output, fields);
    Ok(Answer::unless_errors(
        output,
        &report.errors,
        "the sweep reported errors; the rest was swept, and the next sweep retries them",
    ))
}
