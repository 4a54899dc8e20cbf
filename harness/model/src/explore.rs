//! A breadth-first exhaustive explorer over hashed states.
//!
//! Every reachable state is visited once (a 128-bit fingerprint of each is kept), every property
//! is checked in every state as it is first reached, and breadth-first order makes the first
//! counterexample found a shortest one. Only the fingerprints and a parent pointer per state are
//! kept; a counterexample is rebuilt by replaying its choices from the initial state, this time
//! asking the model to put each step into words.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::hash::{Build, Fingerprint};

/// A transition system to explore.
pub trait Model {
    type State: Clone + Eq + Hash;

    fn initial(&self) -> Self::State;

    /// Every successor of `state`, in an order that depends on `state` only. With `labels`, also
    /// one line of words per successor, saying what that step does.
    fn successors(
        &self,
        state: &Self::State,
        out: &mut Vec<Self::State>,
        labels: Option<&mut Vec<String>>,
    );

    /// The properties that must hold in every reachable state.
    fn check(&self, state: &Self::State) -> Result<(), Violation>;

    /// Whether `state` may be the last one: a state that may not, yet has no successor, is a
    /// deadlock.
    fn may_stop(&self, state: &Self::State) -> bool;

    /// The initial state in words.
    fn describe_initial(&self, state: &Self::State) -> String;

    /// Feeds what identifies `state` for the visited set to `hasher`. Two states that feed the
    /// same must have the same future up to renaming and satisfy the same properties; the
    /// default identifies states exactly.
    fn identify(&self, state: &Self::State, hasher: &mut Fingerprint) {
        self.identify_exactly(state, hasher);
    }

    /// Feeds all of `state` that can make a difference to `hasher`, up to nothing; the default
    /// feeds the whole state.
    fn identify_exactly(&self, state: &Self::State, hasher: &mut Fingerprint) {
        state.hash(hasher);
    }

    /// This model, explored with states identified exactly: slower, for checking that what
    /// `identify` leaves out changes no verdict.
    fn exact(self) -> Exact<Self>
    where
        Self: Sized,
    {
        Exact(self)
    }
}

/// A model explored with its states identified exactly (see [`Model::exact`]).
pub struct Exact<M>(pub M);

impl<M: Model> Model for Exact<M> {
    type State = M::State;

    fn initial(&self) -> Self::State {
        self.0.initial()
    }

    fn successors(
        &self,
        state: &Self::State,
        out: &mut Vec<Self::State>,
        labels: Option<&mut Vec<String>>,
    ) {
        self.0.successors(state, out, labels);
    }

    fn check(&self, state: &Self::State) -> Result<(), Violation> {
        self.0.check(state)
    }

    fn may_stop(&self, state: &Self::State) -> bool {
        self.0.may_stop(state)
    }

    fn describe_initial(&self, state: &Self::State) -> String {
        self.0.describe_initial(state)
    }

    fn identify(&self, state: &Self::State, hasher: &mut Fingerprint) {
        self.0.identify_exactly(state, hasher);
    }
}

/// A property that does not hold, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The property's name, e.g. "S2".
    pub property: &'static str,
    pub detail: String,
}

/// A shortest path from the initial state to a state that violates a property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counterexample {
    pub violation: Violation,
    /// The initial state in words.
    pub start: String,
    /// What each step did, in order.
    pub steps: Vec<String>,
}

impl fmt::Display for Counterexample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "0. {}", self.start)?;
        for (n, step) in self.steps.iter().enumerate() {
            writeln!(f, "{}. {step}", n + 1)?;
        }
        write!(
            f,
            "=> {} violated: {}",
            self.violation.property, self.violation.detail
        )
    }
}

/// What an exploration found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Distinct states reached.
    pub states: u64,
    /// Transitions taken (successors generated, including those leading to known states).
    pub transitions: u64,
    /// The largest number of steps from the initial state to a reached state (breadth-first,
    /// so the length of a shortest path to the farthest state).
    pub max_depth: u32,
    pub elapsed: Duration,
    /// False if the exploration stopped at `max_states` before visiting every state.
    pub complete: bool,
    pub counterexample: Option<Counterexample>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.complete && self.counterexample.is_none()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} transitions, max depth {}, {:.2?}",
            self.states, self.transitions, self.max_depth, self.elapsed
        )?;
        match (&self.counterexample, self.complete) {
            (Some(cex), _) => write!(f, ": COUNTEREXAMPLE\n{cex}"),
            (None, true) => write!(f, ": no violation in any reachable state"),
            (None, false) => write!(f, ": INCOMPLETE (state limit reached), no violation so far"),
        }
    }
}

/// `model` with one property only: that no path meets `steps` one after the other (each in the
/// same state as the one before or a later one). Exploring it finds a shortest path that does (a
/// witness that a behaviour is reachable, so that a check of `model` that passes is not vacuous
/// about it), or shows that there is none. The steps must not tell apart states that `model`
/// identifies (e.g. renamed executions).
pub struct Reach<'m, M: Model> {
    pub model: &'m M,
    #[allow(clippy::type_complexity)]
    pub steps: Vec<Box<dyn Fn(&M::State) -> bool + 'm>>,
    /// The behaviour in words.
    pub what: &'static str,
}

impl<M: Model> Reach<'_, M> {
    /// How many steps are met once `state` is reached, `met` having been met before.
    fn meet(&self, mut met: usize, state: &M::State) -> usize {
        while met < self.steps.len() && (self.steps[met])(state) {
            met += 1;
        }
        met
    }
}

impl<M: Model> Model for Reach<'_, M> {
    /// A state of `model` and how many steps were met on the way to it.
    type State = (M::State, usize);

    fn initial(&self) -> Self::State {
        let state = self.model.initial();
        let met = self.meet(0, &state);
        (state, met)
    }

    fn successors(
        &self,
        (state, met): &Self::State,
        out: &mut Vec<Self::State>,
        labels: Option<&mut Vec<String>>,
    ) {
        let mut next = Vec::new();
        self.model.successors(state, &mut next, labels);
        out.extend(next.into_iter().map(|t| {
            let met = self.meet(*met, &t);
            (t, met)
        }));
    }

    fn check(&self, (_, met): &Self::State) -> Result<(), Violation> {
        if *met == self.steps.len() {
            return Err(Violation {
                property: "reached",
                detail: self.what.to_owned(),
            });
        }
        Ok(())
    }

    fn may_stop(&self, _: &Self::State) -> bool {
        true
    }

    fn describe_initial(&self, (state, _): &Self::State) -> String {
        self.model.describe_initial(state)
    }

    fn identify(&self, (state, met): &Self::State, hasher: &mut Fingerprint) {
        self.model.identify(state, hasher);
        met.hash(hasher);
    }
}

fn fingerprint<M: Model>(model: &M, state: &M::State) -> u128 {
    let mut h = Fingerprint::default();
    model.identify(state, &mut h);
    h.finish128()
}

const ROOT: u32 = u32::MAX;

/// Visits every state reachable from `model.initial()` (or the first `max_states` of them) and
/// returns at the first violated property with a shortest counterexample.
pub fn explore<M: Model>(model: &M, max_states: Option<u64>) -> Report {
    let started = Instant::now();
    // Per discovered state: its parent and which successor of the parent it is.
    let mut nodes: Vec<(u32, u32)> = Vec::new();
    let mut seen: HashSet<u128, Build> = HashSet::default();
    let mut queue: VecDeque<(M::State, u32, u32)> = VecDeque::new();
    let mut transitions = 0u64;
    let mut max_depth = 0u32;

    let initial = model.initial();
    seen.insert(fingerprint(model, &initial));
    nodes.push((ROOT, 0));
    let report = |nodes: &Vec<(u32, u32)>, transitions, max_depth, complete, cex| Report {
        states: nodes.len() as u64,
        transitions,
        max_depth,
        elapsed: started.elapsed(),
        complete,
        counterexample: cex,
    };
    if let Err(violation) = model.check(&initial) {
        let cex = counterexample(model, &nodes, 0, violation);
        return report(&nodes, 0, 0, true, Some(cex));
    }
    queue.push_back((initial, 0, 0));

    let mut successors = Vec::new();
    while let Some((state, index, depth)) = queue.pop_front() {
        successors.clear();
        model.successors(&state, &mut successors, None);
        transitions += successors.len() as u64;
        if successors.is_empty() && !model.may_stop(&state) {
            let violation = Violation {
                property: "L1",
                detail: "deadlock: the system is stuck before every execution has ended".into(),
            };
            let cex = counterexample(model, &nodes, index, violation);
            return report(&nodes, transitions, max_depth, true, Some(cex));
        }
        for (choice, next) in successors.drain(..).enumerate() {
            if !seen.insert(fingerprint(model, &next)) {
                continue;
            }
            let child = u32::try_from(nodes.len()).expect("fewer than 2^32 states");
            nodes.push((index, choice as u32));
            max_depth = max_depth.max(depth + 1);
            if let Err(violation) = model.check(&next) {
                let cex = counterexample(model, &nodes, child, violation);
                return report(&nodes, transitions, max_depth, true, Some(cex));
            }
            if max_states.is_some_and(|max| nodes.len() as u64 >= max) {
                return report(&nodes, transitions, max_depth, false, None);
            }
            queue.push_back((next, child, depth + 1));
        }
    }
    report(&nodes, transitions, max_depth, true, None)
}

/// Rebuilds the path to `target` by replaying its choices, with every step put into words.
fn counterexample<M: Model>(
    model: &M,
    nodes: &[(u32, u32)],
    target: u32,
    violation: Violation,
) -> Counterexample {
    let mut choices = Vec::new();
    let mut at = target;
    while nodes[at as usize].0 != ROOT {
        choices.push(nodes[at as usize].1 as usize);
        at = nodes[at as usize].0;
    }
    choices.reverse();
    let mut state = model.initial();
    let start = model.describe_initial(&state);
    let mut steps = Vec::new();
    let mut next = Vec::new();
    let mut labels = Vec::new();
    for choice in choices {
        next.clear();
        labels.clear();
        model.successors(&state, &mut next, Some(&mut labels));
        steps.push(labels.swap_remove(choice));
        state = next.swap_remove(choice);
    }
    Counterexample {
        violation,
        start,
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two counters that each count to 3; the property "not both at 2" fails after 4 steps.
    struct Counters;

    impl Model for Counters {
        type State = (u8, u8);
        fn initial(&self) -> (u8, u8) {
            (0, 0)
        }
        fn successors(
            &self,
            s: &(u8, u8),
            out: &mut Vec<(u8, u8)>,
            labels: Option<&mut Vec<String>>,
        ) {
            let mut words = Vec::new();
            if s.0 < 3 {
                out.push((s.0 + 1, s.1));
                words.push("a+1".to_owned());
            }
            if s.1 < 3 {
                out.push((s.0, s.1 + 1));
                words.push("b+1".to_owned());
            }
            if let Some(labels) = labels {
                labels.extend(words);
            }
        }
        fn check(&self, s: &(u8, u8)) -> Result<(), Violation> {
            if *s == (2, 2) {
                return Err(Violation {
                    property: "P",
                    detail: "both at 2".into(),
                });
            }
            Ok(())
        }
        fn may_stop(&self, s: &(u8, u8)) -> bool {
            *s == (3, 3)
        }
        fn describe_initial(&self, _: &(u8, u8)) -> String {
            "both at 0".into()
        }
    }

    #[test]
    fn finds_a_shortest_counterexample_and_replays_it_in_words() {
        let report = explore(&Counters, None);
        let cex = report.counterexample.expect("a violation");
        assert_eq!(cex.steps, ["a+1", "a+1", "b+1", "b+1"]);
        assert_eq!(
            cex.to_string(),
            "0. both at 0\n1. a+1\n2. a+1\n3. b+1\n4. b+1\n=> P violated: both at 2"
        );
    }
}
