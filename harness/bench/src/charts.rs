//! The charts under BENCHMARKS.md's headline tables, ours against the AWS sample, drawn from a
//! results file (the bench's `--out`), never from numbers of their own: (a) requests per
//! uncontended critical section, (b) deployment-shaped and saturated contention. `bench charts`
//! redraws them from the committed BENCHMARKS-results.json without running anything; a run with
//! `--charts DIR` draws them from the file it has just written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use semaphore_charts::{Bar, BarChart, BarPanel, ChartError};
use serde::Deserialize;

use crate::common::{Proto, Regime};
use crate::requests::rate_label;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the results file, or writing the charts.
    #[error("{doing} {path}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a results file of this bench")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} has none of the parts the charts are drawn from (requests, load)")]
    NothingToDraw { path: PathBuf },
    #[error(transparent)]
    Chart(#[from] ChartError),
}

/// The error of `doing` ("reading", "writing") `path`.
fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io {
        doing,
        path,
        source,
    }
}

/// What the charts read of a results file; a part the run skipped (`--only`) is absent.
#[derive(Deserialize)]
struct Results {
    repeats: usize,
    requests: Option<Vec<RequestRow>>,
    load: Option<Load>,
}

#[derive(Deserialize)]
struct RequestRow {
    proto: Proto,
    seconds_between_sections: Option<f64>,
    sections: usize,
    /// `null` where the bench wrote a NaN: a named error when drawn.
    requests_per_section: Option<f64>,
}

#[derive(Deserialize)]
struct Load {
    limit: i64,
    medians: Vec<LoadMedian>,
}

#[derive(Deserialize)]
struct LoadMedian {
    regime: Regime,
    proto: Proto,
    contenders: usize,
    throughput_per_s: Option<f64>,
    acquire_p50_ms: Option<f64>,
    acquire_p99_ms: Option<f64>,
    requests_per_section: Option<f64>,
}

/// One chart: its file name in the charts directory, and the chart.
pub struct Chart {
    pub file: &'static str,
    pub chart: BarChart,
}

fn series() -> Vec<String> {
    [Proto::Ours, Proto::Sample]
        .map(|p| p.label().to_owned())
        .to_vec()
}

fn series_index(proto: Proto) -> usize {
    match proto {
        Proto::Ours => 0,
        Proto::Sample => 1,
    }
}

/// The table's row, short enough to stand under its bar.
fn request_label(row: &RequestRow) -> String {
    match (row.proto, row.seconds_between_sections) {
        (Proto::Sample, _) => "AWS sample".to_owned(),
        (Proto::Ours, Some(s)) => rate_label(Duration::from_secs_f64(s)),
        (Proto::Ours, None) if row.sections == 1 => "first on a new lock".to_owned(),
        (Proto::Ours, None) => "back to back".to_owned(),
    }
}

/// The charts a results file holds the numbers for, in BENCHMARKS.md's order.
fn charts(results: &Results) -> Vec<Chart> {
    let mut charts = Vec::new();
    if let Some(rows) = &results.requests {
        charts.push(Chart {
            file: "requests.svg",
            chart: BarChart {
                title: "(a) DynamoDB requests per uncontended critical section".into(),
                series: series(),
                panels: vec![BarPanel {
                    title: "requests per critical section".into(),
                    decimals: 2,
                    bars: rows
                        .iter()
                        .map(|r| Bar {
                            group: request_label(r),
                            series: series_index(r.proto),
                            value: r.requests_per_section.unwrap_or(f64::NAN),
                        })
                        .collect(),
                }],
            },
        });
    }
    if let Some(load) = &results.load {
        for (file, short) in [
            ("load-deployment.svg", "deployment-shaped"),
            ("load-saturated.svg", "saturated"),
        ] {
            let rows: Vec<&LoadMedian> = load
                .medians
                .iter()
                .filter(|m| m.regime.short() == short)
                .collect();
            let Some(regime) = rows.first().map(|m| m.regime) else {
                continue;
            };
            let panel =
                |title: &str, decimals: usize, value: fn(&LoadMedian) -> Option<f64>| BarPanel {
                    title: title.into(),
                    decimals,
                    bars: rows
                        .iter()
                        .map(|m| Bar {
                            group: format!("C={}", m.contenders),
                            series: series_index(m.proto),
                            value: value(m).unwrap_or(f64::NAN),
                        })
                        .collect(),
                };
            charts.push(Chart {
                file,
                chart: BarChart {
                    title: format!(
                        "(b) {}; limit {}, C contenders, medians of {} run(s)",
                        regime.label(),
                        load.limit,
                        results.repeats
                    ),
                    series: series(),
                    panels: vec![
                        panel("critical sections per second", 1, |m| m.throughput_per_s),
                        panel("acquire p50, ms", 1, |m| m.acquire_p50_ms),
                        panel("acquire p99, ms", 1, |m| m.acquire_p99_ms),
                        panel("requests per critical section", 2, |m| {
                            m.requests_per_section
                        }),
                    ],
                },
            });
        }
    }
    charts
}

fn read(path: &Path) -> Result<Results, Error> {
    let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
    serde_json::from_str(&text).map_err(|source| Error::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Draws every chart the results file at `from` has the numbers for into `dir` (made if
/// missing), and returns the files written.
pub fn draw(from: &Path, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let charts = charts(&read(from)?);
    if charts.is_empty() {
        return Err(Error::NothingToDraw {
            path: from.to_owned(),
        });
    }
    // Every chart drawn before any file is written: a bad number leaves the old charts whole.
    let drawn = charts
        .iter()
        .map(|c| Ok((dir.join(c.file), c.chart.svg()?)))
        .collect::<Result<Vec<_>, Error>>()?;
    std::fs::create_dir_all(dir).map_err(io("writing", dir))?;
    for (path, svg) in &drawn {
        std::fs::write(path, svg.as_str()).map_err(io("writing", path))?;
    }
    Ok(drawn.into_iter().map(|(path, _)| path).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use semaphore_charts::{colour, hex};

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    fn committed() -> Results {
        read(&repo().join("BENCHMARKS-results.json")).unwrap()
    }

    /// Per series, the bars' heights in the SVG, in document order.
    fn heights(svg: &str, series: usize) -> Vec<f64> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        let fill = hex(colour(series));
        doc.descendants()
            .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(fill.as_str()))
            .map(|n| n.attribute("height").unwrap().parse().unwrap())
            .collect()
    }

    /// The values written above the bars (centred numbers), in document order.
    fn values(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("text") && n.attribute("text-anchor") == Some("middle"))
            .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
            .filter(|t| t.parse::<f64>().is_ok())
            .collect()
    }

    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
            .collect()
    }

    /// bench/charts holds exactly the charts drawn from the committed results, byte for byte,
    /// and BENCHMARKS.md shows each of them: a chart cannot drift from the file it quotes.
    #[test]
    fn the_committed_charts_are_the_committed_results_drawn() {
        let dir = repo().join("bench/charts");
        let charts = charts(&committed());
        assert_eq!(charts.len(), 3, "requests, deployment-shaped, saturated");
        let markdown = std::fs::read_to_string(repo().join("BENCHMARKS.md")).unwrap();
        for c in &charts {
            let on_disk = std::fs::read_to_string(dir.join(c.file))
                .unwrap_or_else(|e| panic!("{}: {e} (bash bench/run.sh charts)", c.file));
            assert!(
                on_disk == c.chart.svg().unwrap().as_str(),
                "bench/charts/{} is not drawn from BENCHMARKS-results.json: bash bench/run.sh charts",
                c.file
            );
            assert!(
                markdown.contains(&format!("(bench/charts/{})", c.file)),
                "BENCHMARKS.md shows {}",
                c.file
            );
        }
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut drawn: Vec<&str> = charts.iter().map(|c| c.file).collect();
        drawn.sort();
        assert_eq!(files, drawn, "no stale chart in bench/charts");
    }

    /// A table's column, in row order.
    type Column = Vec<f64>;

    /// Each headline table's rows, as the results file has them, are the bars: one per row, in
    /// the table's order, labelled with the row and its value, as tall as the value.
    #[test]
    fn one_bar_per_row_of_each_table_labelled_in_order_and_as_tall_as_its_value() {
        let results = committed();
        let charts = charts(&results);
        let rows = results.requests.as_ref().unwrap();
        let load = &results.load.as_ref().unwrap().medians;
        // (the chart, per panel the table's column in row order, the rows' protocols)
        let requests: Vec<f64> = rows
            .iter()
            .map(|r| r.requests_per_section.unwrap())
            .collect();
        let regime = |short: &str| -> Vec<&LoadMedian> {
            load.iter().filter(|m| m.regime.short() == short).collect()
        };
        let columns = |ms: &[&LoadMedian]| -> Vec<Vec<f64>> {
            vec![
                ms.iter().map(|m| m.throughput_per_s.unwrap()).collect(),
                ms.iter().map(|m| m.acquire_p50_ms.unwrap()).collect(),
                ms.iter().map(|m| m.acquire_p99_ms.unwrap()).collect(),
                ms.iter().map(|m| m.requests_per_section.unwrap()).collect(),
            ]
        };
        let deployment = regime("deployment-shaped");
        let saturated = regime("saturated");
        assert_eq!((deployment.len(), saturated.len()), (6, 6));
        let cases: [(&Chart, Vec<Column>, Vec<Proto>); 3] = [
            (
                &charts[0],
                vec![requests],
                rows.iter().map(|r| r.proto).collect(),
            ),
            (
                &charts[1],
                columns(&deployment),
                deployment.iter().map(|m| m.proto).collect(),
            ),
            (
                &charts[2],
                columns(&saturated),
                saturated.iter().map(|m| m.proto).collect(),
            ),
        ];
        for (chart, columns, protos) in cases {
            let svg = chart.chart.svg().unwrap().into_string();
            // The values above the bars: every column's, in row order, panel after panel.
            let want: Vec<String> = columns
                .iter()
                .zip(&chart.chart.panels)
                .flat_map(|(col, panel)| {
                    let d = panel.decimals;
                    col.iter().map(move |v| format!("{v:.d$}"))
                })
                .collect();
            assert_eq!(values(&svg), want, "{}", chart.file);
            // Per protocol, its rows' bars in document order: panel after panel, its rows in
            // table order. Then, per panel, every bar as tall as its value on one scale.
            let mut panels: Vec<Vec<(f64, f64)>> = vec![Vec::new(); columns.len()];
            for proto in [Proto::Ours, Proto::Sample] {
                let mut hs = heights(&svg, series_index(proto)).into_iter();
                for (panel, col) in columns.iter().enumerate() {
                    for (v, _) in col.iter().zip(&protos).filter(|(_, p)| **p == proto) {
                        let h = hs.next().unwrap_or_else(|| {
                            panic!("{} {proto:?}: a bar missing in panel {panel}", chart.file)
                        });
                        panels[panel].push((h, *v));
                    }
                }
                assert_eq!(hs.next(), None, "{} {proto:?}: one bar per row", chart.file);
            }
            for (panel, bars) in panels.iter().enumerate() {
                let (h_max, v_max) = bars
                    .iter()
                    .fold((0.0, 0.0), |(h, v): (f64, f64), b| (h.max(b.0), v.max(b.1)));
                for (h, v) in bars {
                    // Within plotters' rounding to whole pixels at both ends.
                    assert!(
                        (h - v / v_max * h_max).abs() <= 2.0,
                        "{} panel {panel}: {bars:?}",
                        chart.file
                    );
                }
            }
            let texts = texts(&svg);
            for label in series() {
                assert!(texts.contains(&label), "{}: legend {label}", chart.file);
            }
        }
        let texts = texts(charts[0].chart.svg().unwrap().as_str());
        for label in [
            "back to back",
            "10 CS/s",
            "1 CS/s",
            "1 CS per 10 s",
            "1 CS per 1 min",
            "AWS sample",
            "first on a new lock",
        ] {
            assert!(texts.contains(&label.to_owned()), "(a): {label}");
        }
    }

    /// Drawn from the file: other numbers in the file, other bars; a file without the parts,
    /// or with a number missing, is a named error and writes nothing.
    #[test]
    fn the_charts_follow_the_file_and_refuse_a_file_without_their_numbers() {
        let dir = std::env::temp_dir().join(format!("bench-charts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(repo().join("BENCHMARKS-results.json")).unwrap(),
        )
        .unwrap();
        // Ours' throughput 10x the sample's in every cell: ours' bars now the tallest.
        for m in json["load"]["medians"].as_array_mut().unwrap() {
            if m["proto"] == "ours" {
                m["throughput_per_s"] =
                    serde_json::json!(1000.0 + m["contenders"].as_f64().unwrap());
            }
        }
        let file = dir.join("results.json");
        std::fs::write(&file, json.to_string()).unwrap();
        let out = dir.join("charts");
        let written = draw(&file, &out).unwrap();
        assert_eq!(written.len(), 3);
        let svg = std::fs::read_to_string(out.join("load-saturated.svg")).unwrap();
        let want: Vec<String> = json["load"]["medians"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["regime"].get("saturated").is_some())
            .map(|m| format!("{:.1}", m["throughput_per_s"].as_f64().unwrap()))
            .collect();
        assert_eq!(want[0], "1001.0");
        assert_eq!(values(&svg)[..6], want[..]);
        let ours = heights(&svg, 0);
        let sample = heights(&svg, 1);
        assert!(ours[..3].iter().all(|h| sample[..3].iter().all(|s| h > s)));

        json["load"]["medians"][3]["acquire_p99_ms"] = serde_json::Value::Null;
        std::fs::write(&file, json.to_string()).unwrap();
        let empty = dir.join("not-written");
        let err = draw(&file, &empty).unwrap_err().to_string();
        assert!(err.contains("not a finite number"), "{err}");
        assert!(!empty.exists(), "nothing written");

        let only_size = serde_json::json!({"repeats": 1, "size": {}});
        std::fs::write(&file, only_size.to_string()).unwrap();
        let err = draw(&file, &empty).unwrap_err().to_string();
        assert!(err.contains("none of the parts"), "{err}");
        std::fs::write(&file, "{").unwrap();
        assert!(matches!(draw(&file, &empty), Err(Error::Parse { .. })));
        assert!(!empty.exists(), "nothing written");
    }
}
