//! The model check: every reachable state of small worlds, for the product's protocol (no
//! violation), the AWS sample's (the seed race), and deliberately broken variants of ours (each
//! caught). Run with `--nocapture` to see the state counts, times and traces.

use semaphore_model::world::State;
use semaphore_model::{
    check_ours, check_sample, explore, ours_world, Config, Model, Reach, Report, Variant, Variants,
};

mod support;
use support::show;

/// Ours passes in `config`, a world of exactly this many states and transitions and this depth
/// (pinned: docs/testing.md quotes them, and a change to the model that changes them must be seen).
#[track_caller]
fn assert_safe(name: &str, config: Config, counts: (u64, u64, u32)) -> Report {
    let report = check_ours(config, Variant::Real, None);
    support::assert_passes(name, &report, counts);
    report
}

/// Three executions without the clock moving (so no rotation can drop a fence): every
/// interleaving of acquires, retries, a death, lost and late events and writes.
fn three_executions(limit: u32) -> Config {
    Config {
        ticks: 0,
        rotations: 1,
        ..Config::small(limit)
    }
}

#[test]
fn ours_is_safe_with_three_executions_and_limit_1() {
    assert_safe(
        "3 executions, limit 1",
        three_executions(1),
        (354_254, 1_979_060, 31),
    );
}

#[test]
fn ours_is_safe_with_three_executions_and_limit_2() {
    assert_safe(
        "3 executions, limit 2",
        three_executions(2),
        (197_111, 1_050_860, 29),
    );
}

/// F15: a stray release (another slot's acquire answer naming a working execution's slot, with
/// a token that is not that slot's) at any moment: refused with nothing written, in both layouts,
/// so nobody works without a slot. Without the token check it frees the slot under the work:
/// `every_broken_variant_of_ours_is_caught_in_the_default_world` (release-ignores-token, S1 in
/// 4 steps).
#[test]
fn ours_is_safe_when_a_stray_release_shows_another_slots_token() {
    let stray = Config {
        executions: 2,
        strays: 1,
        ..Config::small(1)
    };
    assert_safe(
        "2 executions, a stray release",
        stray,
        (237_478, 1_067_044, 28),
    );
    assert_safe(
        "gate, 2 executions, a stray release",
        Config {
            layout: semaphore_core::item::Layout::Gate,
            ..stray
        },
        (353_024, 1_617_606, 28),
    );
}

#[test]
fn ours_is_safe_when_the_clock_moves_and_fences_rotate_at_any_moment() {
    // A tick expires every request made before it and lets two rotations drop every fence
    // written before the first: a write in flight across them must still be refused.
    let config = Config {
        executions: 2,
        ..Config::small(1)
    };
    assert_safe(
        "2 executions, a tick, 2 rotations",
        config,
        (74_954, 312_867, 26),
    );
}

#[test]
fn ours_is_safe_with_duplicated_events_and_a_sweep_at_any_moment() {
    let config = Config {
        executions: 2,
        duplicates: 1,
        sweeps: 1,
        ticks: 0,
        rotations: 1,
        ..Config::small(1)
    };
    assert_safe(
        "2 executions, duplicated events, a sweep at any moment",
        config,
        (286_618, 1_391_474, 27),
    );
}

#[test]
fn ours_is_safe_with_lost_writes_work_failures_release_timeouts_and_every_death() {
    let config = Config {
        executions: 2,
        deaths: 2,
        lost_writes: true,
        work_failures: true,
        release_timeouts: true,
        ticks: 0,
        rotations: 1,
        ..Config::small(1)
    };
    assert_safe(
        "2 executions, lost writes, work failures, release timeouts",
        config,
        (224_655, 1_444_748, 30),
    );
}

#[test]
fn the_aws_sample_leaks_a_slot_when_a_delayed_acquire_lands_after_the_cleanup() {
    let report = check_sample(Config::small(1), None);
    show("the AWS sample", &report);
    let cex = report.counterexample.expect("the seed race");
    println!("{cex}");
    assert_eq!(cex.violation.property, "S2");
    assert!(cex.violation.detail.contains("exec-1 has ended"), "{cex}");
    assert!(
        cex.violation.detail.contains("holds a slot, for ever"),
        "{cex}"
    );
    // The seed race, step by step: the acquire is in flight when the execution dies; the
    // one-shot cleanup reads the item, finds nothing to free and writes nothing; the delayed
    // acquire then lands, and nothing will ever free the slot.
    assert!(cex.start.contains("sends UpdateItem"), "{cex}");
    assert_eq!(cex.steps.len(), 3, "{cex}");
    assert!(cex.steps[0].starts_with("exec-1 dies"), "{cex}");
    assert!(
        cex.steps[1].starts_with("the cleanup event for exec-1 is delivered")
            && cex.steps[1].contains("exec-1 holds nothing -> nothing to do"),
        "{cex}"
    );
    assert!(
        cex.steps[2].starts_with("exec-1 acquire #1 (zombie): UpdateItem (take a slot) lands")
            && cex.steps[2].contains("holder:exec-1"),
        "{cex}"
    );
}

#[test]
fn the_aws_sample_also_leaks_through_a_late_retry_with_no_death_at_all() {
    // F3: Step Functions retries the acquire while the first attempt is in flight; the
    // execution works with the retry's slot and releases it; the first attempt lands after.
    let config = Config {
        deaths: 0,
        ..Config::small(1)
    };
    let report = check_sample(config, None);
    show("the AWS sample, no deaths", &report);
    let cex = report.counterexample.expect("the late-retry leak");
    println!("{cex}");
    assert!(["S2", "S3"].contains(&cex.violation.property), "{cex}");
    assert!(cex.steps.iter().any(|s| s.contains("retries")), "{cex}");
}

#[test]
fn without_the_sweeper_a_lost_cleanup_event_leaks_a_slot_of_ours_too() {
    // The sweeper is what S2 needs for F4: with it off, the check must find the leak.
    let config = Config {
        sweeper: false,
        ..Config::small(1)
    };
    let report = check_ours(config, Variant::Real, None);
    show("ours without a sweeper", &report);
    let cex = report.counterexample.expect("a lost event leaks a slot");
    println!("{cex}");
    assert_eq!(cex.violation.property, "S2", "{cex}");
    assert!(
        cex.steps.iter().any(|s| s.contains("(it will be lost)")),
        "{cex}"
    );
    assert!(cex.violation.detail.contains("with no sweeper"), "{cex}");
}

#[test]
fn every_broken_variant_of_ours_is_caught() {
    let config = Config {
        executions: 2,
        ..Config::small(1)
    };
    for (variant, property) in [
        (Variant::CleanupWithoutFence, "S3"),
        (Variant::CleanupSkipsWhenNothingHeld, "S2"),
        (Variant::ReleaseWithoutFence, "S3"),
        (Variant::AcquireWithoutLimit, "S1"),
        (Variant::AcquireChecksFencesWhenSent, "S3"),
        (Variant::RotationWithoutHorizon, "S3"),
        (Variant::ReleaseWithoutWeightCheck, "S1"),
    ] {
        let report = check_ours(config, variant, None);
        show(&variant.name(), &report);
        let cex = report
            .counterexample
            .unwrap_or_else(|| panic!("{}: no violation found", variant.name()));
        assert_eq!(
            cex.violation.property,
            property,
            "{}: {cex}",
            variant.name()
        );
    }
}

#[test]
fn identifying_states_up_to_renaming_and_versions_changes_no_verdict() {
    // The explorer identifies states up to a renaming of the executions and the values of the
    // version counter; exploring every state exactly must give the same verdicts, with
    // counterexamples of the same (shortest) length. The depths may differ: the item also
    // keeps when the last acquisition started (read only by a start rate, which nobody here
    // asks for), and with redrives the farthest states are reached by different numbers of
    // writes, which the version counts; the reduction forgets both, so it is never deeper.
    let plain = Config {
        executions: 2,
        ..Config::small(1)
    };
    for (config, variant) in Variant::all()
        .map(|variant| (plain, variant))
        .chain(Variant::all().map(|variant| (redriven(2), variant)))
    {
        let name = format!("{} ({} redrives)", variant.name(), config.redrives);
        let reduced = explore(&ours_world(config, variant), None);
        let exact = explore(&ours_world(config, variant).exact(), None);
        show(&format!("{name} reduced"), &reduced);
        show(&format!("{name} exact"), &exact);
        assert!(reduced.complete && exact.complete);
        assert_eq!(reduced.passed(), exact.passed(), "{name}");
        assert_eq!(
            reduced.counterexample.map(|c| c.steps.len()),
            exact.counterexample.map(|c| c.steps.len()),
            "{name}"
        );
        if variant == Variant::Real {
            assert!(reduced.max_depth <= exact.max_depth);
            assert!(reduced.states < exact.states);
        }
    }
}

#[test]
fn dropping_fences_without_the_horizon_lets_a_write_decided_before_them_land() {
    // The trace the checker finds for the variant whose acquire does not name the horizon: the
    // write is in flight when the cleanup fences its execution, two rotations a tick apart
    // drop that fence, and the write lands.
    let config = Config {
        executions: 2,
        ..Config::small(1)
    };
    let report = check_ours(config, Variant::RotationWithoutHorizon, None);
    let cex = report.counterexample.expect("a violation");
    println!("{cex}");
    assert_eq!(cex.violation.property, "S3", "{cex}");
    let landed = |words: &str| cex.steps.iter().filter(|s| s.contains(words)).count();
    assert_eq!(landed("the rotation of the fences: "), 2, "{cex}");
    assert_eq!(landed("a tick of the clock passes"), 1, "{cex}");
    assert!(
        cex.steps
            .iter()
            .any(|s| s.contains("fence exec-1 (execution)")),
        "{cex}"
    );
}

/// Executions that fail or are stopped may be redriven once, from the state they stopped in:
/// one death, lost and late events, the final sweep, a tick and two rotations (so that a fence
/// an execution's cleanup wrote before its redrive can be gone again), and no Step Functions
/// retries (they multiply the states; see the next test). A second death lets a redriven
/// incarnation die with an acquire in flight, which finds the hole pinned by
/// `a_second_cleanup_of_a_redriven_execution_can_inherit_the_age_of_its_first_fence`.
fn redriven(executions: u8) -> Config {
    Config {
        executions,
        redrives: 1,
        retries: 0,
        ..Config::small(1)
    }
}

#[test]
fn ours_is_safe_when_a_failed_or_stopped_execution_is_redriven() {
    // `model-check --executions 2 --redrives 1 --retries 0`
    assert_safe(
        "2 executions, 1 redrive",
        redriven(2),
        (109_094, 380_250, 24),
    );
}

#[test]
fn ours_is_safe_when_a_redriven_execution_has_retried_attempts_and_zombies() {
    let config = Config {
        retries: 1,
        ticks: 0,
        rotations: 1,
        ..redriven(2)
    };
    assert_safe(
        "2 executions, 1 redrive, 1 retry each, no tick",
        config,
        (559_030, 2_616_426, 30),
    );
}

#[test]
fn every_redrive_variant_of_ours_is_caught() {
    // One fence for every run breaks S3, in a world of its own (see its test below).
    for variant in
        Variant::all().filter(|v| v.needs_redrives() && *v != Variant::OneFenceForEveryRun)
    {
        // Without a redrive each is the real protocol.
        let calm = Config {
            redrives: 0,
            ..redriven(2)
        };
        let calm = check_ours(calm, variant, None);
        assert!(calm.passed(), "{}: {calm}", variant.name());

        let report = check_ours(redriven(2), variant, None);
        show(&variant.name(), &report);
        let cex = report
            .counterexample
            .unwrap_or_else(|| panic!("{}: no violation found", variant.name()));
        println!("{cex}");
        // A cleanup that does not ask whether the execution runs again fences the run it finds
        // (the redriven one) and refuses it (L1) before it could free its slot (S1).
        if variant == Variant::CleanupIgnoresRedrive {
            assert_eq!(cex.violation.property, "L1", "{cex}");
            assert!(
                cex.steps
                    .iter()
                    .any(|s| s.contains("lands") && s.contains("fence exec-1 run 1 (execution)")),
                "{cex}"
            );
            continue;
        }
        // The old release of a redriven run (its own acquisition only): the run re-attached to
        // the first run's child, whose cleanup found the execution running again, succeeds with
        // the first run's slot still held, for the sweeper to reclaim with a notice (S2).
        if variant == Variant::ReleaseFreesOnlyItsRun {
            assert_eq!(cex.violation.property, "S2", "{cex}");
            let step = |words: &str| cex.steps.iter().position(|s| s.contains(words));
            let reattached =
                step("which still runs: StartExecution returns it").expect("re-attach");
            let running = step("is RUNNING (redriven): nothing to do").expect("left alone");
            let succeeds = step("=> exec-1 succeeds").expect("success");
            assert!(reattached < succeeds && running < succeeds, "{cex}");
            assert!(cex.violation.detail.contains("1 held [exec-1/r0"), "{cex}");
            continue;
        }
        assert_eq!(cex.violation.property, "S1", "{}: {cex}", variant.name());
        assert!(
            cex.violation.detail.starts_with("exec-1/r")
                && cex.violation.detail.contains(
                    "is working under the lock without holding a slot of the acquisition its \
                     child execution is named after"
                ),
            "{}: {cex}",
            variant.name()
        );
        let step = |words: &str| {
            cex.steps
                .iter()
                .position(|s| s.contains(words))
                .unwrap_or_else(|| panic!("{}: no step {words:?}: {cex}", variant.name()))
        };
        let redrive = step("Step Functions redrives exec-1");
        let last = cex.steps.last().expect("steps");
        match variant {
            // The first run's child has ended (one step more since the child outlives a dead
            // parent: a redrive while it runs re-attaches to it); the redrive runs the work again
            // under a new child, without a slot.
            Variant::RedriveWithoutGuard => {
                assert_eq!(cex.steps.len(), 5, "{cex}");
                assert!(last.contains("runs its protected work again"), "{cex}");
            }
            // A zombie acquire of the first incarnation takes r0's slot; the cleanup sees it and
            // sends the write that frees it; the redriven incarnation, acquiring as r0 too (its
            // own run is not fenced), is told "already held" and works under that slot; the
            // late free removes it.
            Variant::RedriveReusesAcquisition => {
                assert!(
                    step("exec-1 acquire #1 (zombie): its write")
                        < step("fence exec-1 (execution)) lands")
                        && step("fence exec-1 (execution)) lands") < redrive,
                    "{cex}"
                );
                assert!(step("AlreadyHeld") > redrive, "{cex}");
                assert!(
                    last.contains("free exec-1/r0's slot, used - 1) lands"),
                    "{cex}"
                );
            }
            // The cleanup asked DescribeExecution (ended) and sent its fence; the execution is
            // redriven into its work and re-attaches to the first run's child, still running,
            // before the fence lands; the cleanup, not asking again, frees the slot that child
            // works under (the other trace of this family: the redriven run acquires r1 before
            // the fence lands, and loses it).
            Variant::CleanupChecksRunningOnlyBeforeFence => {
                assert!(
                    step("the cleanup event for exec-1 is delivered") < redrive,
                    "{cex}"
                );
                assert!(
                    step("StartExecution returns it") < step("fence exec-1 (execution)) lands"),
                    "{cex}"
                );
                assert!(
                    last.contains("free exec-1/r0's slot, used - 1) lands"),
                    "{cex}"
                );
            }
            other => unreachable!("{other:?}"),
        }
    }
}

#[test]
fn a_run_redriven_while_its_child_still_runs_re_attaches_and_its_release_frees_the_first_runs_slot()
{
    // Not vacuous (issue 18, item 9): the real protocol reaches a redrive into the work while
    // the first run's child still runs (its cleanup not yet past its check), the new run waits
    // for that child under the first run's slot, and its release frees that slot itself.
    let world = ours_world(
        Config {
            executions: 1,
            ..redriven(1)
        },
        Variant::Real,
    );
    let reach = Reach {
        model: &world,
        steps: vec![
            Box::new(|s: &State<_, _>| {
                s.incarnation(0) == 1 && s.working(0) && s.child(0) == Some(0)
            }),
            Box::new(|s: &State<_, _>| s.incarnation(0) == 1 && s.ended(0)),
        ],
        what: "a run re-attached to the first run's child, then ended",
    };
    let report = explore(&reach, None);
    let cex = report.counterexample.expect("reachable");
    println!("{cex}");
    let step = |words: &str| cex.steps.iter().position(|s| s.contains(words));
    let reattached = step("which still runs: StartExecution returns it").expect("re-attach");
    let freed = cex
        .steps
        .iter()
        .position(|s| {
            s.starts_with("exec-1 (redrive 1) release #1: its write")
                && s.contains("free exec-1/r0's slot")
                && s.contains("lands")
        })
        .expect("the redriven run's release frees r0");
    assert!(reattached < freed, "{cex}");
    let last = cex.steps.last().expect("steps");
    assert!(last.contains("exec-1 succeeds"), "{cex}");
}

#[test]
fn a_redriven_execution_cleaned_up_before_its_redrive_acquires_in_its_new_run_at_once() {
    // Not vacuous: the real protocol reaches the path the redrive rules are for. The execution
    // dies, its cleanup fences its first run, it is redriven, and its new run acquires with its
    // own acquisition while that fence still stands: no rotation, no wait.
    let world = ours_world(
        Config {
            executions: 1,
            ..redriven(1)
        },
        Variant::Real,
    );
    let reach = Reach {
        model: &world,
        steps: vec![Box::new(|s: &State<_, _>| {
            s.incarnation(0) == 1 && s.working(0) && s.child(0) == Some(1) && s.retired(0, 0)
        })],
        what: "the redriven execution works, its first run cleaned up",
    };
    let report = explore(&reach, None);
    let cex = report.counterexample.expect("reachable");
    println!("{cex}");
    assert!(
        !cex.steps
            .iter()
            .any(|s| s.starts_with("the rotation of the fences")),
        "{cex}"
    );
    let last = cex.steps.last().expect("steps");
    assert!(
        last.contains("exec-1 run 1 (execution) not fenced")
            && last.contains("take a slot for exec-1/r1")
            && last.contains("young fences: exec-1 (execution)")
            && last.contains("Acquired"),
        "{cex}"
    );
}

#[test]
fn one_fence_for_every_run_lets_a_second_cleanup_inherit_the_age_of_the_first() {
    // The hole the fence per run closes (found by this checker). With one execution fence for
    // every run, a redriven execution keeps its ARN and so its fence key: the cleanup after the
    // redriven run ends adds the key the first cleanup added, which changes nothing in the
    // item. A rotation read before the second fence and landing after it ages that key as the
    // first fence's, so the next rotation, a window after the first one's time, drops the
    // second fence at once, and an acquire of the redriven run, requested after the first
    // fence, lands: S3. The derivation of the window assumes every acquire a fence must stop
    // was requested before the fence's first write; a key per run, written only once its run
    // has ended, keeps that true.
    let config = Config {
        executions: 1,
        deaths: 2,
        ..redriven(1)
    };
    // `model-check --executions 1 --deaths 2 --redrives 1 --retries 0`
    assert_safe(
        "1 execution, 1 redrive, 2 deaths",
        config,
        (51_011, 159_640, 22),
    );
    let report = check_ours(config, Variant::OneFenceForEveryRun, None);
    show("1 execution, 1 redrive, 2 deaths", &report);
    let cex = report.counterexample.expect("the hole");
    println!("{cex}");
    assert_eq!(cex.violation.property, "S3", "{cex}");
    let fences: Vec<usize> = cex
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.contains("its write (no checks: fence exec-1 (execution)) lands"))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(fences.len(), 2, "{cex}");
    let rotations: Vec<usize> = cex
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.starts_with("the rotation of the fences"))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(rotations.len(), 2, "{cex}");
    // Both rotations land after the second fence, the first was sent before it.
    let sent = cex
        .steps
        .iter()
        .position(|s| s.contains("sends a rotation of the fences"))
        .expect("a rotation sent");
    assert!(sent < fences[1] && fences[1] < rotations[0], "{cex}");
    assert!(
        cex.steps.last().is_some_and(
            |s| s.contains("exec-1 (redrive 1) acquire #1 (zombie)") && s.contains("Acquired")
        ),
        "{cex}"
    );
}

/// Three executions of weights 2, 1, 1 on a lock of limit 2: the heavy one holds the whole
/// lock, and either light one fits only beside the other.
fn weighted() -> Config {
    let mut weights = [1; semaphore_model::world::MAX_EXECUTIONS];
    weights[0] = 2;
    Config {
        weights,
        ..three_executions(2)
    }
}

#[test]
fn ours_is_safe_with_executions_of_different_weights() {
    let report = assert_safe(
        "3 executions of weights 2, 1, 1, limit 2",
        weighted(),
        (773_262, 4_220_644, 31),
    );
    // A release of an execution that was never answered a slot is its fence alone; its acquire,
    // still in flight, lands first, so the fence is refused and the removal of that slot sent
    // (showing its token): two writes. A removal refused because a cleanup freed the slot first
    // needs nothing more (the cleanup fenced it), so no chain is longer.
    let world = ours_world(weighted(), Variant::Real);
    explore(&world, None);
    let rounds = world.protocol.most_rounds();
    println!("most writes of one release or free: {rounds} ({report})");
    assert_eq!(rounds, 2);
}

#[test]
fn a_release_without_its_weight_check_lets_used_drift_and_the_limit_be_exceeded() {
    // The checker stops at the drift: a zombie release of a slot that a cleanup freed meanwhile
    // lands after another execution took the slot, and subtracts its weight from what that one
    // holds.
    let report = check_ours(Config::small(1), Variant::ReleaseWithoutWeightCheck, None);
    show("release-without-weight-check", &report);
    let cex = report.counterexample.expect("the drift");
    println!("{cex}");
    assert_eq!(
        (cex.violation.property, cex.steps.len()),
        ("S1", 11),
        "{cex}"
    );
    assert!(
        cex.violation
            .detail
            .contains("records 0 held but the holders' weights add up to 1"),
        "{cex}"
    );
    // And the drift does what it threatens: past it, two executions work under a limit of 1.
    let world = ours_world(Config::small(1), Variant::ReleaseWithoutWeightCheck);
    let reach = Reach {
        model: &world,
        steps: vec![Box::new(|s: &State<_, _>| {
            (0..3).filter(|&e| s.working(e)).count() == 2
        })],
        what: "two executions work under a limit of 1",
    };
    let cex = explore(&reach, None).counterexample.expect("reachable");
    println!("{cex}");
    assert!(cex.to_string().contains("no checks: free exec-"), "{cex}");
    // The real release of the same world never gets there.
    let world = ours_world(Config::small(1), Variant::Real);
    let reach = Reach {
        model: &world,
        steps: vec![Box::new(|s: &State<_, _>| {
            (0..3).filter(|&e| s.working(e)).count() == 2
        })],
        what: "two executions work under a limit of 1",
    };
    assert!(explore(&reach, None).counterexample.is_none());
}
