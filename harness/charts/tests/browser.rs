//! The HTML page in a real browser: headless Chromium (Debian's package) loads a page with every
//! kind of chart and a table, and must load it without an error or a request for anything
//! outside the page, lay out every chart with every shape and text drawn (a non-empty box), and
//! paint them (the series' colours are on the screenshot).
//!
//! Chromium is /usr/bin/chromium, or `CHROMIUM` if set. Without it the test says so and passes,
//! except in CI (`CI` set), where .ci/run installs it and its absence is a failure. The check
//! itself is `semaphore_charts::browser`, which the local run's test uses on its report too.

use std::path::Path;

use semaphore_charts::{
    browser, Bar, BarChart, BarPanel, Block, Distribution, Line, LineShape, Marker, Page,
    SampleSet, Section, Table, Timeline, TimelinePanel,
};

/// A page like the local run's report: per lock a timeline, then the distributions, a table.
fn report() -> Page {
    let timeline = Timeline {
        title: "lock jobs: weight in use against the limit, and the line".into(),
        time_label: "seconds since the run started".into(),
        panels: vec![
            TimelinePanel {
                y_label: "weight".into(),
                lines: vec![
                    Line {
                        label: "in use".into(),
                        shape: LineShape::Step,
                        points: (0..40)
                            .map(|i| (i as f64 * 0.5, ((i * 7) % 6) as f64))
                            .collect(),
                    },
                    Line {
                        label: "limit".into(),
                        shape: LineShape::Straight,
                        points: vec![(0.0, 5.0), (19.5, 5.0)],
                    },
                ],
            },
            TimelinePanel {
                y_label: "in line".into(),
                lines: vec![Line {
                    label: "waiting".into(),
                    shape: LineShape::Step,
                    points: (0..40)
                        .map(|i| (i as f64 * 0.5, ((i * 3) % 9) as f64))
                        .collect(),
                }],
            },
        ],
        markers: ["failure", "stop", "cleanup", "sweep", "failure"]
            .iter()
            .enumerate()
            .map(|(i, kind)| Marker {
                at: 2.0 + 3.5 * i as f64,
                kind: (*kind).into(),
            })
            .collect(),
    };
    let distribution = Distribution {
        title: "wait time and hand-off latency".into(),
        value_label: "milliseconds".into(),
        sets: vec![
            SampleSet {
                label: "wait".into(),
                values: (1..200).map(|i| (i * i) as f64 / 40.0).collect(),
            },
            SampleSet {
                label: "hand-off".into(),
                values: (1..100).map(|i| 20.0 + (i % 17) as f64 * 3.0).collect(),
            },
        ],
    };
    let bars = BarChart {
        title: "throughput".into(),
        series: vec!["ours".into(), "AWS sample".into()],
        panels: vec![BarPanel {
            title: "CS/s".into(),
            decimals: 1,
            bars: [(1, 1.9), (1, 1.9), (8, 6.9), (8, 6.2)]
                .iter()
                .enumerate()
                .map(|(i, &(c, v))| Bar {
                    group: format!("C={c}"),
                    series: i % 2,
                    value: v,
                })
                .collect(),
        }],
    };
    Page {
        title: "Local run report".into(),
        sections: vec![
            Section {
                heading: "Lock jobs".into(),
                blocks: vec![
                    Block::Text("Weight in use, the limit and the line, with events.".into()),
                    Block::Chart(timeline.svg().unwrap()),
                ],
            },
            Section {
                heading: "Waits".into(),
                blocks: vec![
                    Block::Chart(distribution.svg().unwrap()),
                    Block::Chart(bars.svg().unwrap()),
                    Block::Table(Table {
                        header: vec!["figure".into(), "value".into()],
                        rows: vec![vec!["executions".into(), "300".into()]],
                    }),
                ],
            },
        ],
    }
}

#[test]
fn chromium_loads_the_report_without_errors_and_draws_every_chart() {
    let Some(chromium) = browser::chromium().unwrap() else {
        eprintln!(
            "SKIPPED chromium_loads_the_report_without_errors_and_draws_every_chart: no Chromium \
             at {} (apt-get install -y chromium, or set CHROMIUM=path)",
            std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
        );
        return;
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("charts-browser");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let page = report();
    let report_path = dir.join("report.html");
    std::fs::write(&report_path, page.html().unwrap()).unwrap();
    let probe = browser::check_page(&chromium, &report_path, page.charts(), 2000)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(probe.svgs.len(), 3, "{probe:?}");
}

/// The check fails on what it is there to catch: a page that asks for something outside
/// itself, and a page with fewer charts than expected.
#[test]
fn the_browser_check_fails_a_page_that_fetches_or_lacks_a_chart() {
    let Some(chromium) = browser::chromium().unwrap() else {
        eprintln!(
            "SKIPPED the_browser_check_fails_a_page_that_fetches_or_lacks_a_chart: no Chromium"
        );
        return;
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("charts-browser-bad");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let page = report();
    let html = page.html().unwrap();
    let path = dir.join("missing-image.html");
    std::fs::write(
        &path,
        html.replacen("</body>", "<img src=\"nowhere.png\" alt=\"\"></body>", 1),
    )
    .unwrap();
    let err = browser::check_page(&chromium, &path, page.charts(), 2000).unwrap_err();
    assert!(err.to_string().contains("nowhere.png"), "{err}");
    let path = dir.join("report.html");
    std::fs::write(&path, &html).unwrap();
    let err = browser::check_page(&chromium, &path, page.charts() + 1, 2000).unwrap_err();
    assert!(
        err.to_string().contains("3 charts laid out, 4 expected"),
        "{err}"
    );
}
