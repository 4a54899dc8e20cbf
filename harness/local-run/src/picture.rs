//! The run's picture: an HTML page beside the logs (`report.html`), drawn from the report with
//! `semaphore_charts`. Per lock, the weight in use against the limit and the line's length over
//! time, as the poller read them, with the run's failures, stops, cleanups and sweeps marked;
//! then the distributions of the waits and of the hand-off latency; then the invariants.

use std::path::Path;

use semaphore_charts::{
    Block, ChartError, Distribution, Line, LineShape, Marker, Page, SampleSet, Section, Table,
    Timeline, TimelinePanel,
};

use crate::report::Report;

/// The page's file name in the run's directory.
pub const FILE: &str = "report.html";

/// Writes the page into the run's directory (`report.logs`) and answers its path; says why on
/// stderr and answers None if it could not (the text report stands without it).
pub fn write(report: &Report) -> Option<String> {
    let path = Path::new(&report.logs).join(FILE);
    let written = page(report)
        .and_then(|p| p.html())
        .map_err(anyhow::Error::from)
        .and_then(|html| Ok(std::fs::write(&path, html)?));
    match written {
        Ok(()) => Some(path.display().to_string()),
        Err(e) => {
            eprintln!("cannot write the HTML report {}: {e:#}", path.display());
            None
        }
    }
}

/// Seconds from `start_ms` (the poller's start) to `at_ms`, both epoch ms.
fn seconds(start_ms: i64, at_ms: i64) -> f64 {
    (at_ms - start_ms) as f64 / 1000.0
}

/// The kinds of marks, in the order they are coloured (a chart colours kinds in the order they
/// first come, so every lock's chart lists them in this order, by time within a kind).
const KINDS: [&str; 4] = ["failure", "stop", "cleanup", "sweep"];

/// A lock's events: its executions' failures (FAILED, TIMED_OUT) and stops (ABORTED) as
/// played to EventBridge, the cleanups their deliveries started, and every sweep; none before
/// the poller started.
fn markers(report: &Report, lock: usize) -> Vec<Marker> {
    let start = report.poller.started_ms;
    let ours = |arn: &str| report.lock_of.get(arn) == Some(&lock);
    let ended = report.events.ended.iter().filter(|(_, arn, _)| ours(arn));
    let mut marks: Vec<(i64, &str)> = ended
        .filter_map(|(at, _, status)| match status.as_str() {
            "FAILED" | "TIMED_OUT" => Some((*at, "failure")),
            "ABORTED" => Some((*at, "stop")),
            _ => None,
        })
        .collect();
    let delivered = report.events.delivered.iter().filter(|(_, arn)| ours(arn));
    marks.extend(delivered.map(|(at, _)| (*at, "cleanup")));
    let sweeps = report.sweeper.iter().flat_map(|s| &s.started_ms);
    marks.extend(sweeps.map(|at| (*at, "sweep")));
    marks.sort_by_key(|&(at, kind)| (KINDS.iter().position(|k| *k == kind), at));
    marks
        .into_iter()
        .filter(|(at, _)| *at >= start)
        .map(|(at, kind)| Marker {
            at: seconds(start, at),
            kind: kind.to_owned(),
        })
        .collect()
}

/// A lock's timeline: the weight in use (a step line) against the limit, and the line's length,
/// from the poller's start to its last sample or the last marker, whichever is later.
fn timeline(report: &Report, lock: usize) -> Timeline {
    let l = &report.locks[lock];
    let start = report.poller.started_ms;
    let samples = report.poller.lock(&l.lock).samples;
    let markers = markers(report, lock);
    let last_sample = samples.last().map_or(0.0, |s| seconds(start, s.at_ms));
    let end = markers.iter().map(|m| m.at).fold(last_sample, f64::max);
    let step = |value: fn(&local_aws::poller::Sample) -> u64| {
        let mut points: Vec<(f64, f64)> = samples
            .iter()
            .map(|s| (seconds(start, s.at_ms).max(0.0), value(s) as f64))
            .collect();
        if let Some(&(_, last)) = points.last() {
            points.push((end, last));
        }
        points
    };
    Timeline {
        title: format!(
            "lock {}: weight in use against its limit, and its line",
            l.lock
        ),
        time_label: "seconds since the poller started".into(),
        panels: vec![
            TimelinePanel {
                y_label: "weight".into(),
                lines: vec![
                    Line {
                        label: "in use".into(),
                        shape: LineShape::Step,
                        points: step(|s| s.weight),
                    },
                    Line {
                        label: format!("limit {}", l.limit),
                        shape: LineShape::Straight,
                        points: vec![(0.0, l.limit as f64), (end, l.limit as f64)],
                    },
                ],
            },
            TimelinePanel {
                y_label: "waiting".into(),
                lines: vec![Line {
                    label: "in line".into(),
                    shape: LineShape::Step,
                    points: step(|s| s.waiting),
                }],
            },
        ],
        markers,
    }
}

/// A distribution with one sample set per lock, or a sentence when no lock has a sample.
fn distribution(report: &Report, title: &str, unit: &str, samples: &[(usize, f64)]) -> Block {
    let sets: Vec<SampleSet> = report
        .locks
        .iter()
        .enumerate()
        .map(|(i, l)| SampleSet {
            label: l.lock.clone(),
            values: samples
                .iter()
                .filter(|(lock, _)| *lock == i)
                .map(|(_, v)| *v)
                .collect(),
        })
        .collect();
    let chart = Distribution {
        title: title.to_owned(),
        value_label: unit.to_owned(),
        sets,
    };
    match chart.svg() {
        Ok(svg) => Block::Chart(svg),
        Err(_) => Block::Text(format!("{title}: no sample in this run.")),
    }
}

/// The page: a section per lock, one for the line (when the protocol has one), one for the
/// invariants.
pub fn page(report: &Report) -> Result<Page, ChartError> {
    let mut sections = Vec::new();
    for (i, l) in report.locks.iter().enumerate() {
        sections.push(Section {
            heading: format!("Lock {}", l.lock),
            blocks: vec![
                Block::Text(format!(
                    "{} executions, {} succeeded; at most {} holders and weight {} of {} held \
                     at once over {} reads; {} slots held at the end. Marks: failures and stops \
                     as the executions ended, cleanups as their status events were delivered, \
                     sweeps as they started.",
                    l.executions,
                    l.succeeded,
                    l.max_holders,
                    l.max_weight,
                    l.limit,
                    l.reads,
                    l.leaked_at_end
                )),
                Block::Chart(timeline(report, i).svg()?),
            ],
        });
    }
    match &report.line {
        Some(line) => {
            let waits = line.waits_s.clone();
            let hand_offs: Vec<(usize, f64)> = line
                .hand_offs_ms
                .iter()
                .map(|(lock, ms)| (*lock, *ms as f64))
                .collect();
            sections.push(Section {
                heading: "The line".into(),
                blocks: vec![
                    distribution(
                        report,
                        "wait time: from asking to entering the work",
                        "seconds",
                        &waits,
                    ),
                    distribution(
                        report,
                        "hand-off latency: slot freed to waiter resumed",
                        "milliseconds",
                        &hand_offs,
                    ),
                ],
            });
        }
        None => sections.push(Section {
            heading: "The line".into(),
            blocks: vec![Block::Text(
                "This protocol has no line to measure (the sample's executions poll).".into(),
            )],
        }),
    }
    sections.push(Section {
        heading: "Invariants".into(),
        blocks: vec![Block::Table(Table {
            header: vec!["check".into(), "result".into(), "detail".into()],
            rows: report
                .checks
                .iter()
                .map(|c| {
                    let result = if c.ok { "ok" } else { "FAILED" };
                    vec![c.name.clone(), result.into(), c.detail.clone()]
                })
                .collect(),
        })],
    });
    Ok(Page {
        title: format!(
            "Local run report: {} protocol, seed {}{}",
            report.protocol,
            report.seed,
            if report.ok {
                ", every invariant held"
            } else {
                ", an invariant FAILED"
            }
        ),
        sections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::LineReport;
    use crate::report::{Check, LockReport, SweeperCounts};
    use local_aws::poller::{LockPoll, Sample};

    /// A small made-up run: two locks, the poller's samples, ended executions, deliveries and
    /// sweeps, waits and hand-offs.
    fn run() -> Report {
        let start = 1_000_000;
        let mut report = Report {
            protocol: "versioned".into(),
            seed: 7,
            ok: true,
            ..Report::default()
        };
        report.poller.started_ms = start;
        for (name, limit, samples) in [
            (
                "jobs",
                3,
                vec![(100, 0, 0), (1_500, 2, 0), (2_000, 3, 4), (5_000, 1, 0)],
            ),
            ("other", 2, vec![(200, 0, 0), (3_000, 2, 1), (4_000, 0, 0)]),
        ] {
            report.locks.push(LockReport {
                lock: name.into(),
                limit,
                ..LockReport::default()
            });
            let samples = samples
                .into_iter()
                .map(|(at, weight, waiting)| Sample {
                    at_ms: start + at,
                    weight,
                    waiting,
                })
                .collect();
            report.poller.locks.insert(
                name.into(),
                LockPoll {
                    samples,
                    ..LockPoll::default()
                },
            );
        }
        report.lock_of = [("a", 0), ("b", 0), ("c", 1), ("d", 1), ("probe", 5)]
            .map(|(arn, lock)| (arn.to_owned(), lock))
            .into();
        report.events.ended = [
            (start + 2_500, "a", "FAILED"),
            (start + 3_500, "b", "ABORTED"),
            (start + 3_600, "c", "SUCCEEDED"),
            (start + 3_700, "c", "ABORTED"),
            (start + 4_200, "d", "FAILED"),
        ]
        .map(|(at, arn, status)| (at, arn.to_owned(), status.to_owned()))
        .into();
        report.events.delivered = vec![(start + 3_900, "b".into()), (start + 4_100, "c".into())];
        report.sweeper = Some(SweeperCounts {
            started_ms: vec![start + 4_500, start + 6_000],
            ..SweeperCounts::default()
        });
        report.line = Some(LineReport {
            waits_s: vec![(0, 1.5), (0, 2.5), (1, 0.5)],
            hand_offs_ms: vec![(0, 40), (1, 90)],
            ..LineReport::default()
        });
        report.checks.push(Check {
            name: "S1 safety [jobs]".into(),
            ok: true,
            detail: "held".into(),
        });
        report
    }

    #[test]
    fn each_lock_gets_its_timeline_from_the_poller_and_its_own_marks() {
        let report = run();
        let jobs = timeline(&report, 0);
        // The weight in use steps through the samples, in seconds since the poller started,
        // and holds its last value to the last mark (the final sweep, 6 s).
        let in_use = &jobs.panels[0].lines[0];
        assert_eq!(
            in_use.points,
            vec![(0.1, 0.0), (1.5, 2.0), (2.0, 3.0), (5.0, 1.0), (6.0, 1.0)]
        );
        assert_eq!(jobs.panels[0].lines[1].points, vec![(0.0, 3.0), (6.0, 3.0)]);
        assert_eq!(jobs.panels[0].lines[1].label, "limit 3");
        let waiting: Vec<f64> = jobs.panels[1].lines[0].points.iter().map(|p| p.1).collect();
        assert_eq!(waiting, vec![0.0, 0.0, 4.0, 0.0, 0.0]);
        let marks = |t: &Timeline| -> Vec<(f64, String)> {
            t.markers.iter().map(|m| (m.at, m.kind.clone())).collect()
        };
        let at = |s: f64, kind: &str| (s, kind.to_owned());
        assert_eq!(
            marks(&jobs),
            vec![
                at(2.5, "failure"),
                at(3.5, "stop"),
                at(3.9, "cleanup"),
                at(4.5, "sweep"),
                at(6.0, "sweep")
            ]
        );
        // The other lock: its own executions' failure, stop and cleanup (not a success), the
        // sweeps; kind by kind, so that a kind has the same colour on every lock's chart.
        let other = timeline(&report, 1);
        assert_eq!(
            marks(&other),
            vec![
                at(4.2, "failure"),
                at(3.7, "stop"),
                at(4.1, "cleanup"),
                at(4.5, "sweep"),
                at(6.0, "sweep")
            ]
        );
        assert_eq!(other.panels[0].lines[0].points.last(), Some(&(6.0, 0.0)));
    }

    #[test]
    fn the_page_has_a_chart_per_lock_and_the_two_distributions_of_the_run() {
        let report = run();
        let page = page(&report).unwrap();
        assert_eq!(page.charts(), report.locks.len() + 2);
        let html = page.html().unwrap();
        for text in [
            "lock jobs: weight in use against its limit, and its line",
            "lock other: weight in use against its limit, and its line",
            "limit 2",
            // The distributions' legends: per lock, its count, p50 and p99.
            "jobs: n 2, p50 1.50, p99 2.50",
            "other: n 1, p50 0.50, p99 0.50",
            "jobs: n 1, p50 40.0, p99 40.0",
            "other: n 1, p50 90.0, p99 90.0",
            "<td>S1 safety [jobs]</td><td>ok</td>",
        ] {
            assert!(html.contains(text), "{text}");
        }
        // Without waiters, the distributions are a sentence each, not an empty chart.
        let mut calm = run();
        calm.line = Some(LineReport::default());
        let page = super::page(&calm).unwrap();
        assert_eq!(page.charts(), calm.locks.len());
        assert!(page.html().unwrap().contains("no sample in this run"));
    }

    #[test]
    fn the_page_is_written_beside_the_logs_and_its_path_ends_the_text_report() {
        let dir = std::env::temp_dir().join(format!("picture-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut report = run();
        report.logs = dir.display().to_string();
        report.html_report = write(&report);
        let path = dir.join(FILE);
        assert_eq!(report.html_report, Some(path.display().to_string()));
        let html = std::fs::read_to_string(&path).unwrap();
        assert_eq!(html.matches("<svg").count(), 4);
        assert!(report
            .render()
            .ends_with(&format!("HTML report: {}\n", path.display())));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
