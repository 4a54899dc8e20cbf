//! Pollers (issue #27) in their own small world (`semaphore_model::poll`): the product's
//! protocol passes; each broken variant is caught, with the shortest counterexample pinned; a
//! poll window longer than the lease is shown to lose a granted slot; and identifying states up
//! to what nothing reads changes no verdict. Run with `--nocapture` to see the state counts,
//! times and traces.

use semaphore_model::{
    check_pollers, explore, Model, PollConfig, PollVariant, PollWorld, Report, Variants,
};

mod support;
use support::{assert_caught, assert_passes, show};

/// The product passes with the poller asking and renewing its place once (the default world,
/// with its third poll, is `model-check --pollers`, pinned in `tests/commands.rs`). Re-pinned
/// when the acquire function became the core's flow (issue #38): 1,716,273 -> 1,768,679 states,
/// as the flow keeps state the restatement dropped (the place a check read, the round of a
/// queueing it is in) and each write is sent with the clock of the step that sends it (the
/// restatement sent a later round's queue write with the first round's clock).
#[test]
fn pollers_pass_with_a_holder_a_poller_that_may_stop_and_a_parked_execution_that_may_die() {
    let config = PollConfig {
        polls: 2,
        ..PollConfig::small()
    };
    let report = check_pollers(config, PollVariant::Real, None);
    assert_passes("pollers, 2 polls", &report, (1_768_679, 6_441_494, 43));
}

#[test]
fn every_broken_variant_of_the_pollers_is_caught() {
    for (variant, property, steps, words) in [
        // The grant to the poller lands without a lease: a slot nobody can free if it stops.
        (
            PollVariant::GrantWithoutLease,
            "S2",
            8,
            "poller holds a slot without a lease",
        ),
        // A hand-off that read the poller's record after its time ran out grants it anyway: the
        // slot goes to a waiter gone as far as anyone can tell, for a whole lease.
        (
            PollVariant::HandOffGrantsStoppedPoller,
            "F8",
            15,
            "its record's time had run out more than the clock skew before",
        ),
        // exec's hand-off judges the poller's record stopped, the poller's renewal lands, and
        // the plain leave takes the renewed record out of line.
        (
            PollVariant::LeaveStoppedWithoutRecordCheck,
            "L2",
            19,
            "taken out of line as stopped though",
        ),
        // A record taken out of line as soon as its time ran out by the judge's clock, within
        // the skew.
        (
            PollVariant::StoppedWithoutSkew,
            "L2",
            10,
            "taken out of line as stopped though",
        ),
        // The poller polls in time but its record keeps the old time: exec's hand-off, a skew
        // ahead, takes it out of line.
        (
            PollVariant::PollKeepsOldTime,
            "L2",
            19,
            "poller was taken out of line without a grant while it polled in time",
        ),
        // The holder's hand-off grants the poller (its lease from tick 0), the poller finds it
        // at its poll of tick 1 and counts its lease from there; exec, a skew ahead, takes the
        // lease back at tick 2 and works while the poller still believes in it.
        (
            PollVariant::PollerCountsFromThePollThatFoundIt,
            "S1",
            18,
            "exec and poller (its lease running, by its clock) work at once",
        ),
    ] {
        let report = check_pollers(PollConfig::small(), variant, None);
        assert_caught(&variant.name(), report, property, steps, words);
    }
    // Every variant is listed above.
    assert_eq!(PollVariant::all().count(), 7);
}

/// The edge of what is promised: a poller that polls within its poll window, but not within
/// its lease, finds the slot a hand-off granted it taken back, and is fenced (the acquire
/// function does not check that `poll_seconds` is below the lease).
#[test]
fn a_poll_window_longer_than_the_lease_loses_a_granted_slot() {
    let config = PollConfig {
        poll_ticks: 2,
        ..PollConfig::small()
    };
    let report = check_pollers(config, PollVariant::Real, None);
    show("poll window 2, lease 1", &report);
    let cex = report.counterexample.expect("a violation");
    println!("{cex}");
    assert_eq!(
        (cex.violation.property, cex.steps.len()),
        ("L1", 16),
        "{cex}"
    );
    let text = cex.to_string();
    assert!(text.contains("takes back the leases that passed"), "{text}");
    assert!(text.contains("poller was answered \"fenced\""), "{text}");
}

/// States are identified up to the versions, tokens, what the invocations read but will not
/// use, the parked execution's clock and what is gone: explored exactly instead, every world
/// here has the same verdict, and every counterexample the same length.
#[test]
fn identifying_states_up_to_what_nothing_reads_changes_no_verdict() {
    let verdict = |report: &Report| {
        report
            .counterexample
            .as_ref()
            .map(|cex| (cex.violation.property, cex.steps.len()))
    };
    let small = PollConfig {
        polls: 1,
        deaths: 0,
        ..PollConfig::small()
    };
    let worlds = [(small, PollVariant::Real)]
        .into_iter()
        .chain(PollVariant::all().map(|v| (PollConfig::small(), v)))
        .chain([(
            PollConfig {
                poll_ticks: 2,
                ..PollConfig::small()
            },
            PollVariant::Real,
        )]);
    for (config, variant) in worlds {
        if config == PollConfig::small() && variant == PollVariant::Real {
            continue;
        }
        let reduced = explore(&PollWorld::new(config, variant), None);
        let exact = explore(&PollWorld::new(config, variant).exact(), None);
        let name = format!("{} ({config:?})", variant.name());
        show(&format!("{name}, reduced"), &reduced);
        show(&format!("{name}, exact"), &exact);
        assert!(reduced.complete && exact.complete);
        assert_eq!(verdict(&reduced), verdict(&exact), "{name}");
        assert!(reduced.states <= exact.states);
    }
}
