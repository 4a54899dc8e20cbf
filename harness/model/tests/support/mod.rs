//! What every model test does with a report: show it, pin a pass, expect a broken variant
//! caught. Each test file uses what it needs.
#![allow(dead_code)]

use semaphore_model::{Counterexample, Report};

pub fn show(name: &str, report: &Report) {
    println!("{name}: {report}");
}

/// `report` passed: every state visited, none violating a property, in exactly `(states,
/// transitions, depth)`: pinned, so that a change to the model that changes them is seen.
pub fn assert_passes(name: &str, report: &Report, counts: (u64, u64, u32)) {
    show(name, report);
    if let Some(cex) = &report.counterexample {
        panic!("{name}: {cex}");
    }
    assert!(report.complete, "{name}: {report}");
    assert_eq!(
        (report.states, report.transitions, report.max_depth),
        counts,
        "{name}: {report}"
    );
}

/// `report`, of a broken variant, found a violation of `property` in exactly `steps` steps
/// (the shortest, breadth first), whose trace says `words`: its counterexample.
pub fn assert_caught(
    name: &str,
    report: Report,
    property: &str,
    steps: usize,
    words: &str,
) -> Counterexample {
    show(name, &report);
    let cex = report
        .counterexample
        .unwrap_or_else(|| panic!("{name}: no violation found"));
    println!("{cex}");
    assert_eq!(
        (cex.violation.property, cex.steps.len()),
        (property, steps),
        "{name}: {cex}"
    );
    assert!(cex.to_string().contains(words), "{name}: {cex}");
    cex
}
