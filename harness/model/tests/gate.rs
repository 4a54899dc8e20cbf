//! The gate layout in the model checker: the same worlds and the same writes, with each released
//! acquisition kept as a tombstone, which a rotation's turn drops once a rotation a fence window
//! after its release has passed it (`protocol::drop_tombstones`). Run with `--nocapture` to see
//! the state counts and the traces.

use semaphore_core::item::Layout;
use semaphore_model::{check_ours, explore, ours_world, Config, Model, Variant, Variants};

mod support;
use support::{assert_caught, assert_passes, show};

fn gate(config: Config) -> Config {
    Config {
        layout: Layout::Gate,
        ..config
    }
}

/// Two executions, two ticks of the clock and three rotations' turns: a release at either
/// tick, its tombstone dropped at any moment a rotation a window later allows, with late
/// attempts of its acquire (a retry's zombie) in flight across the drop.
fn clock_moves() -> Config {
    gate(Config {
        executions: 2,
        ticks: 2,
        rotations: 3,
        ..Config::small(1)
    })
}

#[test]
fn the_gate_is_safe_when_the_clock_moves_and_tombstones_are_dropped() {
    // `model-check --layout gate --executions 2 --ticks 2 --rotations 3`. More states than the
    // item layout's world of the same faults: a tombstone carries its release time, and its
    // drop is a step of its own.
    let report = check_ours(clock_moves(), Variant::Real, None);
    assert_passes(
        "gate, 2 ticks, 3 rotations",
        &report,
        (598_839, 2_608_059, 30),
    );
}

#[test]
fn the_gate_is_safe_when_a_failed_or_stopped_execution_is_redriven() {
    // `model-check --layout gate --executions 2 --redrives 1 --retries 0`: a redriven run
    // acquires under its own acquisition while the first run's tombstone or fence may stand.
    let config = gate(Config {
        executions: 2,
        redrives: 1,
        retries: 0,
        ..Config::small(1)
    });
    let report = check_ours(config, Variant::Real, None);
    assert_passes("gate, 1 redrive", &report, (165_927, 588_773, 24));
}

#[test]
fn every_broken_variant_of_the_gate_is_caught() {
    for (variant, property, steps, words) in [
        // A TTL on the holding items alone: a zombie acquire lands once the tombstone is gone.
        (
            Variant::DropTombstoneEarly,
            "S3",
            12,
            "drop exec-1's tombstone",
        ),
        // A rotation in the same tick as the release is not past the horizon of an acquire
        // requested just before it.
        (
            Variant::DropTombstoneAtAnyRotation,
            "S3",
            12,
            "drop exec-1's tombstone",
        ),
        // No tombstone at all.
        (Variant::ReleaseWithoutFence, "S3", 8, "(zombie)"),
        // The gate keeps ended executions' fences and rotates them as the item does: an
        // acquire that does not name the horizon lands once its cleanup's fence is dropped.
        (
            Variant::RotationWithoutHorizon,
            "S3",
            10,
            "rotate (drop old, age 0 young)",
        ),
    ] {
        let report = check_ours(clock_moves(), variant, None);
        assert_caught(&variant.name(), report, property, steps, words);
    }
}

#[test]
fn identifying_states_up_to_renaming_changes_no_gate_verdict() {
    let config = gate(Config {
        executions: 2,
        ..Config::small(1)
    });
    for variant in [
        Variant::Real,
        Variant::DropTombstoneEarly,
        Variant::DropTombstoneAtAnyRotation,
        Variant::ReleaseWithoutFence,
    ] {
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
            assert!(reduced.states < exact.states);
        }
    }
}
