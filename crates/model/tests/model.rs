//! The model check: every reachable state of small worlds, for the product's protocol (no
//! violation), the AWS sample's (the seed race), and deliberately broken variants of ours (each
//! caught). Run with `--nocapture` to see the state counts, times and traces.

use semaphore_model::{check_ours, check_sample, explore, ours_world, Config, Report, Variant};

fn show(name: &str, report: &Report) {
    println!("{name}: {report}");
}

fn assert_safe(name: &str, config: Config, at_least: u64) -> Report {
    let report = check_ours(config, Variant::Real, None);
    show(name, &report);
    assert!(report.passed(), "{name}: {report}");
    // Guard against a vacuous world.
    assert!(
        report.states > at_least,
        "{name}: only {} states",
        report.states
    );
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
    assert_safe("3 executions, limit 1", three_executions(1), 100_000);
}

#[test]
fn ours_is_safe_with_three_executions_and_limit_2() {
    assert_safe("3 executions, limit 2", three_executions(2), 100_000);
}

#[test]
fn ours_is_safe_when_the_clock_moves_and_fences_rotate_at_any_moment() {
    // A tick expires every request made before it and lets two rotations drop every fence
    // written before the first: a write in flight across them must still be refused.
    let config = Config {
        executions: 2,
        ..Config::small(1)
    };
    assert_safe("2 executions, a tick, 2 rotations", config, 50_000);
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
        50_000,
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
    let report = check_ours(config, Variant::Real, None);
    show(
        "2 executions, lost writes, work failures, release timeouts",
        &report,
    );
    assert!(report.passed(), "{report}");
    assert!(report.states > 50_000, "only {} states", report.states);
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
    ] {
        let report = check_ours(config, variant, None);
        show(variant.name(), &report);
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
    // counterexamples of the same (shortest) length and the same depth.
    let config = Config {
        executions: 2,
        ..Config::small(1)
    };
    for variant in Variant::ALL {
        let reduced = explore(&ours_world(config, variant), None);
        let exact = explore(&ours_world(config, variant).exact(), None);
        show(&format!("{} reduced", variant.name()), &reduced);
        show(&format!("{} exact", variant.name()), &exact);
        assert!(reduced.complete && exact.complete);
        assert_eq!(reduced.passed(), exact.passed(), "{}", variant.name());
        assert_eq!(
            reduced.counterexample.map(|c| c.steps.len()),
            exact.counterexample.map(|c| c.steps.len()),
            "{}",
            variant.name()
        );
        if variant == Variant::Real {
            assert_eq!(reduced.max_depth, exact.max_depth);
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
