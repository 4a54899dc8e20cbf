//! The HTML page in a real browser: headless Chromium (Debian's package) loads a page with every
//! kind of chart and a table, and must load it without an error or a request for anything
//! outside the page, lay out every chart with every shape and text drawn (a non-empty box), and
//! paint them (the series' colours are on the screenshot).
//!
//! Chromium is /usr/bin/chromium, or `CHROMIUM` if set. Without it the test says so and passes,
//! except in CI (`CI` set), where .ci/run installs it and its absence is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use semaphore_charts::{
    colour, Bar, BarChart, BarPanel, Block, Distribution, Line, LineShape, Marker, Page, SampleSet,
    Section, Table, Timeline, TimelinePanel,
};

/// `CHROMIUM` if set (only it), else Debian's.
fn chromium() -> Option<PathBuf> {
    let candidates = match std::env::var_os("CHROMIUM") {
        Some(path) => vec![PathBuf::from(path)],
        None => ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .map(PathBuf::from)
            .to_vec(),
    };
    candidates.into_iter().find(|p| p.is_file())
}

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

/// Records errors from the first moment, then at `load` writes what the browser laid out into
/// the DOM that --dump-dom prints: per SVG its box, its shapes and texts, and how many of each
/// have a non-empty box (drawn); the errors; the resources fetched.
const PROBE_HEAD: &str = "<script>window.__errors=[];\
addEventListener('error',e=>__errors.push(String(e.message||(e.target&&e.target.outerHTML))),true);\
</script>";
const PROBE_BODY: &str = "<script>addEventListener('load',()=>{\
const drawn=els=>els.filter(e=>{const b=e.getBBox();return b.width>0||b.height>0}).length;\
const svgs=[...document.querySelectorAll('svg')].map(s=>{\
const r=s.getBoundingClientRect();\
const shapes=[...s.querySelectorAll('rect,polyline,line,circle,path,polygon')];\
const texts=[...s.querySelectorAll('text')];\
return {width:r.width,height:r.height,shapes:shapes.length,shapes_drawn:drawn(shapes),\
texts:texts.length,texts_drawn:drawn(texts)}});\
const p=document.createElement('pre');p.id='probe';\
p.textContent=JSON.stringify({svgs,errors:__errors,\
resources:performance.getEntriesByType('resource').map(r=>r.name)});\
document.body.appendChild(p)});</script>";

/// Runs Chromium headless on `page` with `args`, killed if it takes over a minute.
fn run_chromium(chromium: &Path, dir: &Path, args: &[String]) -> std::process::Output {
    let profile = dir.join(format!("profile-{}", args.len()));
    let child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let id = child.id();
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(output) => output.expect("chromium's output"),
        Err(_) => {
            // Only the process this test started.
            let _ = Command::new("kill").arg(id.to_string()).status();
            panic!(
                "chromium did not finish in {:?}: {args:?}",
                started.elapsed()
            );
        }
    }
}

#[test]
fn chromium_loads_the_report_without_errors_and_draws_every_chart() {
    let Some(chromium) = chromium() else {
        if std::env::var_os("CI").is_some() {
            panic!("CI must install Chromium (.ci/run: apt-get install chromium)");
        }
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
    let html = page.html().unwrap();
    let report_path = dir.join("report.html");
    std::fs::write(&report_path, &html).unwrap();
    // The probe goes into a copy, so that the page under test is the page as written.
    let probed = html
        .replacen("<head>", &format!("<head>{PROBE_HEAD}"), 1)
        .replacen("</body>", &format!("{PROBE_BODY}</body>"), 1);
    let probed_path = dir.join("probed.html");
    std::fs::write(&probed_path, probed).unwrap();

    let dom = run_chromium(
        &chromium,
        &dir,
        &[
            "--dump-dom".into(),
            format!("file://{}", probed_path.display()),
        ],
    );
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    let probe = dom_text
        .split_once("<pre id=\"probe\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        // The text as HTML serialises it: only &, < and > escaped.
        .map(|(json, _)| {
            json.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&")
        })
        .unwrap_or_else(|| {
            panic!(
                "the probe did not run: status {:?}, stderr {}",
                dom.status,
                String::from_utf8_lossy(&dom.stderr)
            )
        });
    let probe = Probe::parse(&probe);
    assert!(probe.errors.is_empty(), "errors: {:?}", probe.errors);
    assert!(
        probe.resources.is_empty(),
        "the page fetched {:?}",
        probe.resources
    );
    assert_eq!(probe.svgs.len(), page.charts(), "{probe:?}");
    for (i, svg) in probe.svgs.iter().enumerate() {
        assert!(
            svg.width > 300.0 && svg.height > 200.0,
            "chart {i}: {svg:?}"
        );
        assert!(svg.shapes > 10 && svg.texts > 5, "chart {i}: {svg:?}");
        assert_eq!(svg.shapes_drawn, svg.shapes, "chart {i}: every shape drawn");
        assert_eq!(
            svg.texts_drawn, svg.texts,
            "chart {i}: every text laid out (a font)"
        );
    }

    // Painted: the page as written, on a screenshot, shows each series' colour over an area.
    let png = dir.join("report.png");
    let shot = run_chromium(
        &chromium,
        &dir,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1000,2000".into(),
            format!("file://{}", report_path.display()),
        ],
    );
    assert!(
        png.is_file(),
        "no screenshot: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let pixels = rgb_pixels(&png);
    let total = pixels.len();
    let white = pixels.iter().filter(|p| **p == [255, 255, 255]).count();
    assert!(
        white < total * 97 / 100,
        "the page is blank: {white} of {total} white"
    );
    for series in 0..2 {
        let c = colour(series);
        let count = pixels.iter().filter(|p| **p == [c.0, c.1, c.2]).count();
        assert!(count > 500, "series {series}: {count} pixels of its colour");
    }
}

fn rgb_pixels(path: &Path) -> Vec<[u8; 3]> {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    assert!(
        step >= 3 && info.bit_depth == png::BitDepth::Eight,
        "{info:?}"
    );
    buf[..info.buffer_size()]
        .chunks(step)
        .map(|p| [p[0], p[1], p[2]])
        .collect()
}

#[derive(Debug)]
struct SvgProbe {
    width: f64,
    height: f64,
    shapes: u64,
    shapes_drawn: u64,
    texts: u64,
    texts_drawn: u64,
}

#[derive(Debug)]
struct Probe {
    svgs: Vec<SvgProbe>,
    errors: Vec<String>,
    resources: Vec<String>,
}

impl Probe {
    fn parse(json: &str) -> Probe {
        let v: serde_json::Value = serde_json::from_str(json).expect("the probe's JSON");
        let strings = |key: &str| -> Vec<String> {
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        Probe {
            svgs: v["svgs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| SvgProbe {
                    width: s["width"].as_f64().unwrap(),
                    height: s["height"].as_f64().unwrap(),
                    shapes: s["shapes"].as_u64().unwrap(),
                    shapes_drawn: s["shapes_drawn"].as_u64().unwrap(),
                    texts: s["texts"].as_u64().unwrap(),
                    texts_drawn: s["texts_drawn"].as_u64().unwrap(),
                })
                .collect(),
            errors: strings("errors"),
            resources: strings("resources"),
        }
    }
}
