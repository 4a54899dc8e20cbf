//! Leases (F13) in their own small world (`semaphore_model::lease`): the product's protocol
//! passes; each broken variant is caught, with the shortest counterexample pinned.

use semaphore_model::{check_leases, LeaseConfig, LeaseVariant, Variants};

mod support;
use support::{assert_caught, assert_passes};

#[test]
fn leases_pass_with_two_holders_a_retry_a_heartbeat_and_three_ticks() {
    let report = check_leases(LeaseConfig::small(), LeaseVariant::Real, None);
    assert_passes("leases", &report, (158_233, 577_692, 20));
}

#[test]
fn every_broken_variant_of_the_leases_is_caught() {
    for (variant, property, steps, words) in [
        // A retried acquire still in flight lands after the take-back: with no fence, the
        // taken-back acquisition holds a slot again.
        (
            LeaseVariant::TakeBackWithoutFence,
            "S3",
            9,
            "holds a slot again after it was taken back",
        ),
        // A heartbeat with no check lands after its slot is gone and sets a lease nobody holds
        // (and its holder, answered "renewed", would go on working).
        (
            LeaseVariant::HeartbeatWithoutCheck,
            "S1",
            6,
            "keeps a lease of h-1, which holds no slot",
        ),
        // h-2, whose clock is a skew ahead, takes h-1's lease as soon as it ended by h-2's
        // clock, while h-1 still believes in it by its own.
        (
            LeaseVariant::TakeBackWithoutSkew,
            "S1",
            7,
            "h-1 and h-2 work at once believing their leases run",
        ),
    ] {
        let report = check_leases(LeaseConfig::small(), variant, None);
        assert_caught(&variant.name(), report, property, steps, words);
    }
    // Every variant is listed above.
    assert_eq!(LeaseVariant::all().count(), 4);
}
