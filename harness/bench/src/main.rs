//! `bench`: our protocol against the original AWS sample's, side by side, in one run against the
//! same local server; plus the item size, the Lambdas and the sweeper. Writes every number to a
//! JSON file and prints the tables BENCHMARKS.md quotes, ending with issue 9's targets as
//! measured. Exits 1 if any number is not sane (a count that must be exact is not, a section did
//! not finish, more than `limit` holders, an error); whether a target is met is reported, never
//! asserted: speed depends on the machine.
//!
//! The local server (moto behind one lock) serves one request at a time: every throughput and
//! latency figure is bounded by it, and compares the protocols' request patterns, not AWS.

mod bill;
mod charts;
mod common;
mod lambdas;
mod load;
mod requests;
mod rule;
mod scale;
mod size;
mod stats;
mod sweeper;
mod writes;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use semaphore_core::Clock;
use serde::Serialize;
use serde_json::{json, Value};

use common::{Proto, Regime};
use stats::{median, ratio};

#[derive(Parser)]
#[command(
    about = "Benchmarks: our semaphore protocol against the AWS sample's, on the local server"
)]
struct Cli {
    /// Where to write every measured number (JSON).
    #[arg(long, default_value = "BENCHMARKS-results.json")]
    out: PathBuf,
    /// A run small enough for CI (seconds): one repeat, few sections; checks sanity, not speed.
    #[arg(long)]
    smoke: bool,
    /// Repeats of every latency/throughput measurement (medians are quoted).
    #[arg(long)]
    repeats: Option<usize>,
    /// The deployment-shaped regime: how many milliseconds one second of the state machine
    /// lasts (the slot is held one such second; waits are 1..(a+4) of them). Default 500 (100
    /// with --smoke): long enough that the local server is not saturated.
    #[arg(long)]
    unit_ms: Option<u64>,
    /// The saturated regime: how long a contender holds its slot.
    #[arg(long, default_value_t = 10)]
    hold_ms: u64,
    /// The rate-limited load variant's start rate, acquisitions per second (real time, in both
    /// regimes).
    #[arg(long, default_value = "5", value_parser = semaphore_core::Rate::parse)]
    rate: semaphore_core::Rate,
    /// Only these parts (comma-separated): requests, load, size, scale, lambdas, sweeper.
    #[arg(long, value_delimiter = ',', value_parser = PARTS)]
    only: Vec<String>,
    /// The scale part's limits (comma-separated; default 10,100,1000,10000, with --smoke
    /// 10,100). Filling a lock of 10,000 holders takes the local server most of an hour.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    scale_limits: Vec<u32>,
    /// Where the natively built handler binaries are (default: next to this binary).
    #[arg(long)]
    lambda_bin_dir: Option<PathBuf>,
    /// After the run, draw the headline tables' charts from the results file (`--out`) into
    /// this directory (bench/run.sh: bench/charts, next to BENCHMARKS.md).
    #[arg(long)]
    charts: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Draw the headline tables' charts from a results file, running nothing.
    Charts {
        /// The results file a run wrote.
        #[arg(long, default_value = "BENCHMARKS-results.json")]
        from: PathBuf,
        /// Where to write the SVG files.
        #[arg(long, default_value = "bench/charts")]
        dir: PathBuf,
    },
}

impl Cli {
    fn wanted(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

/// The parts of a run, in the order they run (`--only` names them).
const PARTS: [&str; 6] = ["requests", "load", "size", "scale", "lambdas", "sweeper"];

/// Draws the charts from `from` into `dir`, saying which files it wrote.
fn draw_charts(from: &std::path::Path, dir: &std::path::Path) -> Result<()> {
    for file in charts::draw(from, dir).context("charts")? {
        println!("drew {}", file.display());
    }
    Ok(())
}

/// The medians over a cell's runs that both summaries quote.
#[derive(Serialize)]
struct Medians {
    throughput_per_s: f64,
    acquire_p50_ms: f64,
    acquire_p99_ms: f64,
    release_p50_ms: f64,
    release_p99_ms: f64,
    requests_per_section: f64,
    failed_writes_per_section: f64,
    full_answers_per_section: f64,
}

/// The median over `runs` of one figure of theirs (NaN for none).
fn med<T>(runs: &[&T], g: fn(&T) -> f64) -> f64 {
    median(&runs.iter().map(|r| g(r)).collect::<Vec<_>>()).unwrap_or(f64::NAN)
}

/// The largest over `runs` of one figure of theirs (0 for none).
fn most<T, N: Ord + Default>(runs: &[&T], g: fn(&T) -> N) -> N {
    runs.iter().map(|r| g(r)).max().unwrap_or_default()
}

impl Medians {
    fn of(runs: &[&load::LoadRun]) -> Self {
        Self {
            throughput_per_s: med(runs, |r| r.throughput_per_s),
            acquire_p50_ms: med(runs, |r| r.acquire_p50_ms),
            acquire_p99_ms: med(runs, |r| r.acquire_p99_ms),
            release_p50_ms: med(runs, |r| r.release_p50_ms),
            release_p99_ms: med(runs, |r| r.release_p99_ms),
            requests_per_section: med(runs, |r| r.requests_per_section),
            failed_writes_per_section: med(runs, |r| r.failed_writes_per_section),
            full_answers_per_section: med(runs, |r| r.full_answers_per_section),
        }
    }
}

/// A load variant (weights, a start rate) against the same run's plain figures of ours, at the
/// same regime and contenders: medians over the repeats.
#[derive(Serialize)]
struct VariantSummary {
    regime: Regime,
    variant: String,
    label: String,
    contenders: usize,
    runs: usize,
    #[serde(flatten)]
    medians: Medians,
    throughput_vs_plain: f64,
    requests_vs_plain: f64,
    acquire_p99_vs_plain: f64,
    rate_limited_answers_per_section: f64,
    /// The largest weight held at once in any run, and the limit.
    max_weight_seen: i64,
    limit: i64,
    rate_per_s: Option<f64>,
    /// The most starts in any 1 s / 10 s window in any run, and the least spacing of any run.
    max_starts_in_1s: usize,
    max_starts_in_10s: usize,
    min_start_spacing_ms: Option<u64>,
    achieved_start_rate_per_s: f64,
    errors_total: u64,
    /// The plain figures compared against (ours, weight 1 of the plain limit).
    plain_throughput_per_s: f64,
    plain_requests_per_section: f64,
    plain_acquire_p50_ms: f64,
    plain_acquire_p99_ms: f64,
}

#[derive(Serialize)]
struct LoadSummary {
    regime: Regime,
    proto: Proto,
    contenders: usize,
    runs: usize,
    #[serde(flatten)]
    medians: Medians,
    throughput_vs_sample: f64,
    /// The median run's acquire p99 over the sample's.
    acquire_p99_vs_sample: f64,
    requests_vs_sample: f64,
    rotations_per_section: f64,
    expired_answers_total: u64,
    /// Errors of any kind in all runs; expected 0.
    errors_total: u64,
    item_bytes_at_end: f64,
}

/// One of issue 9's targets, as this run measured it.
#[derive(Serialize)]
struct Target {
    target: String,
    measured: String,
    met: bool,
}

/// The first line of the file at `path` that starts with `prefix`, if any.
fn line_of(path: impl AsRef<std::path::Path>, prefix: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_owned)
}

fn machine() -> Value {
    let cpu = line_of("/proc/cpuinfo", "model name").map_or("unknown".to_owned(), |l| {
        l["model name".len()..]
            .trim_start_matches([' ', '\t', ':'])
            .to_owned()
    });
    let requirements = local_aws::server::repo_root().join("local/requirements.txt");
    let moto = line_of(requirements, "moto").unwrap_or_default();
    let date = semaphore_core::rfc3339_millis(semaphore_core::SystemClock.now_ms());
    json!({
        "date": date,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "memory": line_of("/proc/meminfo", "MemTotal").unwrap_or_default(),
        "kernel": line_of("/proc/sys/kernel/osrelease", "").unwrap_or_default(),
        "server": format!("{moto} behind local/moto_server.py (one request at a time), on 127.0.0.1"),
        "endpoint": local_aws::endpoint(),
    })
}

fn f(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".to_owned()
    } else {
        format!("{x:.digits$}")
    }
}

/// Two figures in one cell, as the tables print them: "12.5 / 30.1".
fn pair(a: f64, b: f64, digits: usize) -> String {
    format!("{} / {}", f(a, digits), f(b, digits))
}

/// A ratio as the tables print it: "1.05x".
fn times(x: f64) -> String {
    f(x, 2) + "x"
}

/// Prints a markdown table: its header and alignment rows (a column whose name `header` starts
/// with `>` is right-aligned), one row per item of `rows` (its cells), and a blank line.
fn print_table(header: &str, rows: impl IntoIterator<Item = Vec<String>>) {
    let align: String = (header.trim_matches(['|', ' ']).split(" | "))
        .map(|c| if c.starts_with('>') { "---:|" } else { "---|" })
        .collect();
    println!("{}\n|{align}", header.replace("| >", "| "));
    for cells in rows {
        println!("| {} |", cells.join(" | "));
    }
    println!();
}

/// A run: what its parts read, and what they report.
struct Bench {
    cli: Cli,
    repeats: usize,
    endpoint: String,
    table: String,
    /// Numbers that are not sane: the run fails.
    problems: Vec<String>,
    targets: Vec<Target>,
    /// The results file, part by part.
    out: serde_json::Map<String, Value>,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    if let Some(Command::Charts { from, dir }) = &cli.command {
        draw_charts(from, dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    let started = Instant::now();
    let repeats = cli.repeats.unwrap_or(if cli.smoke { 1 } else { 5 });
    let machine = machine();
    println!(
        "# semaphore bench{}\n",
        if cli.smoke { " (smoke)" } else { "" }
    );
    println!(
        "server: {}\n",
        machine["server"].as_str().unwrap_or_default()
    );
    let mut bench = Bench {
        out: serde_json::Map::from_iter([
            ("smoke".to_owned(), json!(cli.smoke)),
            ("repeats".to_owned(), json!(repeats)),
            ("machine".to_owned(), machine),
        ]),
        repeats,
        endpoint: local_aws::endpoint().to_owned(),
        table: local_aws::fresh_table().await.table().to_owned(),
        problems: Vec::new(),
        targets: Vec::new(),
        cli,
    };
    let mut timings = serde_json::Map::new();
    for part in PARTS {
        if !bench.cli.wanted(part) {
            continue;
        }
        let part_started = Instant::now();
        let done = match part {
            "requests" => bench.requests().await,
            "load" => bench.load().await,
            "size" => bench.size().await,
            "scale" => bench.scale().await,
            "lambdas" => bench.lambdas().await,
            _ => bench.sweeper().await,
        };
        if let Err(e) = done {
            bench.problems.push(format!("{part}: {e:#}"));
        }
        let seconds = part_started.elapsed().as_secs_f64();
        timings.insert(part.into(), json!(seconds));
        eprintln!("{part}: {seconds:.1} s");
    }
    let cli = &bench.cli;
    if !bench.targets.is_empty() {
        println!(
            "## Targets (issue 9){}\n",
            if cli.smoke {
                ": a smoke run measures nothing, these only show the wiring"
            } else {
                ""
            }
        );
        print_table(
            "| target | measured | met? |",
            bench.targets.iter().map(|t| {
                let met = if t.met { "yes" } else { "**no**" };
                vec![t.target.clone(), t.measured.clone(), met.to_owned()]
            }),
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    bench.out.extend([
        ("targets".to_owned(), json!(bench.targets)),
        ("wall_seconds".to_owned(), json!(elapsed)),
        ("part_seconds".to_owned(), Value::Object(timings)),
        ("problems".to_owned(), json!(bench.problems)),
    ]);
    let text = serde_json::to_string_pretty(&Value::Object(bench.out))?;
    std::fs::write(&cli.out, text + "\n")
        .with_context(|| format!("cannot write {}", cli.out.display()))?;
    println!("wrote {} in {elapsed:.1} s", cli.out.display());
    // The charts are of the requests and load tables: a run of other parts draws none.
    if let Some(dir) = cli
        .charts
        .as_ref()
        .filter(|_| cli.wanted("requests") || cli.wanted("load"))
    {
        draw_charts(&cli.out, dir)?;
    }
    for p in &bench.problems {
        eprintln!("PROBLEM: {p}");
    }
    Ok(if bench.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

impl Bench {
    /// (a) requests per uncontended critical section
    async fn requests(&mut self) -> Result<()> {
        let sections = if self.cli.smoke { 5 } else { 50 };
        let ms = Duration::from_millis;
        let rates: &[(Duration, usize)] = if self.cli.smoke {
            // Enough sections at each rate for the rule to rotate: a release rotates once 8
            // young fences are kept (the 7th after a lock's first section) and a window has
            // passed since the last rotation.
            &[(ms(100), 12), (ms(1_000), 20), (ms(60_000), 16)]
        } else {
            &[
                (ms(100), 300),
                (ms(1_000), 50),
                (ms(10_000), 20),
                (ms(60_000), 20),
            ]
        };
        let report = requests::run(&self.endpoint, &self.table, sections, rates).await?;
        println!(
            "## DynamoDB requests per uncontended critical section (acquire + release), counted\n"
        );
        println!("Ours as the Lambdas run it: each call a new `Semaphore` (no read, no cache), default timing (fence window {} s). A release rotates the lock's fences (one more `UpdateItem`) when a window has passed since the last rotation and the young generation holds at least {} fences: at most once per window and once per {} releases, so it is counted at several rates on a simulated clock too.\n", f(semaphore_core::Timing::default().window().as_secs_f64(), 0), rule::BUSY_YOUNG_FENCES, rule::BUSY_YOUNG_FENCES);
        let all: Vec<&requests::RequestRow> = report
            .rows
            .iter()
            .chain(std::iter::once(&report.first_section))
            .collect();
        print_table(
            "| scenario | >sections | >requests/CS | >GetItem | >PutItem | >UpdateItem | >rotations/CS | >failed conditional writes/CS | >vs sample |",
            all.iter().map(|r| {
                vec![
                    r.scenario.clone(),
                    r.sections.to_string(),
                    f(r.requests_per_section, 2),
                    f(r.get_item, 2),
                    f(r.put_item, 2),
                    f(r.update_item, 2),
                    f(r.rotations_per_section, 3),
                    f(r.failed_conditional_writes, 2),
                    times(r.vs_sample),
                ]
            }),
        );
        requests::check(&report, &mut self.problems);
        let ours: Vec<&requests::RequestRow> =
            report.rows.iter().filter(|r| r.proto == "ours").collect();
        if let Some(r) = ours.first() {
            self.targets.push(Target {
                target: "uncontended requests per CS, as the Lambdas run, <= 1.25x the sample's; 0 failed conditional writes".into(),
                measured: format!(
                    "{} = {}x back to back, {} failed; with rotations: {}",
                    f(r.requests_per_section, 2),
                    f(r.vs_sample, 2),
                    f(r.failed_conditional_writes, 2),
                    report
                        .rows
                        .iter()
                        .filter_map(|r| r.seconds_between_sections.map(|s| format!(
                            "{} at {}",
                            times(r.vs_sample),
                            requests::rate_label(Duration::from_secs_f64(s))
                        )))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                met: ours
                    .iter()
                    .all(|r| r.vs_sample <= 1.25 && r.failed_conditional_writes == 0.0),
            });
            let worst = ours
                .iter()
                .map(|r| r.requests_per_section)
                .fold(0.0, f64::max);
            self.targets.push(Target {
                target: "acquire then release on an uncontended lock, each a fresh process (semctl): <= 3 requests".into(),
                measured: format!(
                    "{} at most over the rates above ({} on a lock's first use)",
                    f(worst, 2),
                    f(report.first_section.requests_per_section, 0)
                ),
                met: worst <= 3.0,
            });
        }
        self.out.insert("requests".into(), json!(all));
        Ok(())
    }

    /// (b) latency and throughput under contention
    async fn load(&mut self) -> Result<()> {
        let cli = &self.cli;
        let repeats = self.repeats;
        let regimes = [
            Regime::Deployment {
                unit_ms: cli.unit_ms.unwrap_or(if cli.smoke { 100 } else { 500 }),
            },
            Regime::Saturated {
                hold_ms: cli.hold_ms,
            },
        ];
        // (contenders, critical sections per run) for each regime.
        let plan = |regime: Regime| -> &'static [(usize, usize)] {
            match (cli.smoke, regime) {
                (true, _) => &[(1, 3), (8, 8), (50, 10)],
                (false, Regime::Deployment { .. }) => &[(1, 20), (8, 60), (50, 100)],
                (false, Regime::Saturated { .. }) => &[(1, 100), (8, 100), (50, 100)],
            }
        };
        let protos = [Proto::Ours, Proto::Sample];
        let variants = [
            load::Variant::Weighted,
            load::Variant::RateLimited(cli.rate),
        ];
        let mut runs: Vec<load::LoadRun> = Vec::new();
        let mut variant_runs: Vec<load::LoadRun> = Vec::new();
        for rep in 0..repeats {
            for regime in regimes {
                for &(contenders, sections) in plan(regime) {
                    // Alternate the order so that no protocol always runs first (or last); then
                    // the variants of ours, under contention only.
                    let mut kinds: Vec<(Proto, load::Variant)> = (0..protos.len())
                        .map(|k| (protos[(k + rep) % protos.len()], load::Variant::Plain))
                        .collect();
                    if contenders > 1 {
                        kinds.extend(variants.map(|v| (Proto::Ours, v)));
                    }
                    for (proto, variant) in kinds {
                        let run = load::run(
                            regime,
                            proto,
                            variant,
                            contenders,
                            sections,
                            &self.endpoint,
                            &self.table,
                        );
                        match run.await {
                            Ok(run) => {
                                let who = match variant {
                                    load::Variant::Plain => format!("{:<24}", proto.label()),
                                    _ => format!("ours, {:<20}", variant.name()),
                                };
                                eprintln!(
                                    "load rep {rep} {:<17} C={contenders:<2} {who} {:>7.1} CS/s  acquire p50 {:>7.1} ms  req/CS {:.2}",
                                    regime.short(),
                                    run.throughput_per_s,
                                    run.acquire_p50_ms,
                                    run.requests_per_section
                                );
                                load::check(&run, &mut self.problems);
                                match variant {
                                    load::Variant::Plain => runs.push(run),
                                    _ => variant_runs.push(run),
                                }
                            }
                            Err(e) => self.problems.push(format!("{e:#}")),
                        }
                    }
                }
            }
        }
        let mut summaries = Vec::new();
        let mut variant_summaries = Vec::new();
        for regime in regimes {
            for &(contenders, _) in plan(regime) {
                let of = |proto: Proto| -> Vec<&load::LoadRun> {
                    runs.iter()
                        .filter(|r| {
                            r.regime == regime && r.proto == proto && r.contenders == contenders
                        })
                        .collect()
                };
                let sample = Medians::of(&of(Proto::Sample));
                for proto in protos {
                    let rs = of(proto);
                    if rs.is_empty() {
                        continue;
                    }
                    let m = Medians::of(&rs);
                    summaries.push(LoadSummary {
                        regime,
                        proto,
                        contenders,
                        runs: rs.len(),
                        throughput_vs_sample: ratio(m.throughput_per_s, sample.throughput_per_s),
                        acquire_p99_vs_sample: ratio(m.acquire_p99_ms, sample.acquire_p99_ms),
                        requests_vs_sample: ratio(
                            m.requests_per_section,
                            sample.requests_per_section,
                        ),
                        rotations_per_section: med(&rs, |r| r.rotations_per_section),
                        expired_answers_total: rs.iter().map(|r| r.expired_answers).sum(),
                        errors_total: rs.iter().map(|r| r.errors).sum(),
                        item_bytes_at_end: med(&rs, |r| r.item_bytes_at_end as f64),
                        medians: m,
                    });
                }
                if contenders == 1 {
                    continue;
                }
                let plain = Medians::of(&of(Proto::Ours));
                for variant in variants {
                    let rs: Vec<&load::LoadRun> = variant_runs
                        .iter()
                        .filter(|r| {
                            r.regime == regime
                                && r.contenders == contenders
                                && r.variant.as_ref().map(|v| v.variant.as_str())
                                    == Some(variant.name().as_str())
                        })
                        .collect();
                    if rs.is_empty() {
                        continue;
                    }
                    let figures: Vec<&load::VariantFigures> =
                        rs.iter().filter_map(|r| r.variant.as_ref()).collect();
                    let m = Medians::of(&rs);
                    variant_summaries.push(VariantSummary {
                        regime,
                        variant: variant.name(),
                        label: variant.label(),
                        contenders,
                        runs: rs.len(),
                        throughput_vs_plain: ratio(m.throughput_per_s, plain.throughput_per_s),
                        requests_vs_plain: ratio(
                            m.requests_per_section,
                            plain.requests_per_section,
                        ),
                        acquire_p99_vs_plain: ratio(m.acquire_p99_ms, plain.acquire_p99_ms),
                        rate_limited_answers_per_section: med(&figures, |v| {
                            v.rate_limited_answers_per_section
                        }),
                        max_weight_seen: most(&figures, |v| v.max_weight_seen),
                        limit: variant.limit(),
                        rate_per_s: variant.rate().map(semaphore_core::Rate::as_per_second),
                        max_starts_in_1s: most(&figures, |v| v.max_starts_in_1s),
                        max_starts_in_10s: most(&figures, |v| v.max_starts_in_10s),
                        min_start_spacing_ms: figures
                            .iter()
                            .filter_map(|v| v.min_start_spacing_ms)
                            .min(),
                        achieved_start_rate_per_s: med(&figures, |v| v.achieved_start_rate_per_s),
                        errors_total: rs.iter().map(|r| r.errors).sum(),
                        plain_throughput_per_s: plain.throughput_per_s,
                        plain_requests_per_section: plain.requests_per_section,
                        plain_acquire_p50_ms: plain.acquire_p50_ms,
                        plain_acquire_p99_ms: plain.acquire_p99_ms,
                        medians: m,
                    });
                }
            }
        }
        for regime in regimes {
            println!(
                "## Contention, {}: limit {}, medians of {repeats} run(s) per cell\n",
                regime.label(),
                load::LIMIT
            );
            print_table(
                "| >contenders | protocol | >CS/s | >vs sample | >acquire p50 / p99 ms | >p99 vs sample | >release p50 / p99 ms | >requests/CS | >vs sample | >failed cond. writes/CS | >\"full\" answers/CS | >rotations/CS | >errors (all runs) | >item bytes at end |",
                summaries.iter().filter(|s| s.regime == regime).map(|s| {
                    let m = &s.medians;
                    vec![
                        s.contenders.to_string(),
                        s.proto.label().to_owned(),
                        f(m.throughput_per_s, 1),
                        times(s.throughput_vs_sample),
                        pair(m.acquire_p50_ms, m.acquire_p99_ms, 1),
                        times(s.acquire_p99_vs_sample),
                        pair(m.release_p50_ms, m.release_p99_ms, 1),
                        f(m.requests_per_section, 2),
                        times(s.requests_vs_sample),
                        f(m.failed_writes_per_section, 2),
                        f(m.full_answers_per_section, 2),
                        f(s.rotations_per_section, 3),
                        s.errors_total.to_string(),
                        f(s.item_bytes_at_end, 0),
                    ]
                }),
            );
        }
        for s in &summaries {
            let tp = s.medians.throughput_per_s;
            if tp.is_nan() || tp <= 0.0 {
                self.problems.push(format!(
                    "{} C={}: no throughput",
                    s.proto.label(),
                    s.contenders
                ));
            }
        }
        let ours = |regime: &'static str| {
            summaries
                .iter()
                .filter(move |s| s.proto == Proto::Ours && s.regime.short() == regime)
        };
        let listed = |rows: Vec<&LoadSummary>, g: fn(&LoadSummary) -> f64| {
            rows.iter()
                .map(|s| format!("{}x at {}", f(g(s), 2), s.contenders))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let deployment: Vec<&LoadSummary> = ours("deployment-shaped").collect();
        self.targets.push(Target {
            target: "deployment-shaped throughput >= 0.95x the sample's at 1, 8 and 50 contenders"
                .into(),
            measured: listed(deployment.clone(), |s| s.throughput_vs_sample),
            met: !deployment.is_empty()
                && deployment.iter().all(|s| s.throughput_vs_sample >= 0.95),
        });
        let contended: Vec<&LoadSummary> = deployment
            .iter()
            .copied()
            .filter(|s| s.contenders > 1)
            .collect();
        self.targets.push(Target {
            target: "deployment-shaped acquire p99 <= 2x the sample's at 8 and 50 contenders"
                .into(),
            measured: listed(contended.clone(), |s| s.acquire_p99_vs_sample),
            met: !contended.is_empty() && contended.iter().all(|s| s.acquire_p99_vs_sample <= 2.0),
        });
        let saturated: Vec<&LoadSummary> = ours("saturated").filter(|s| s.contenders > 1).collect();
        let errors: u64 = summaries.iter().map(|s| s.errors_total).sum();
        self.targets.push(Target {
            target: "saturated throughput >= 0.8x the sample's at 8 and 50 contenders; 0 errors"
                .into(),
            measured: format!(
                "{}; {errors} errors in all runs",
                listed(saturated.clone(), |s| s.throughput_vs_sample)
            ),
            met: !saturated.is_empty()
                && saturated.iter().all(|s| s.throughput_vs_sample >= 0.8)
                && errors == 0,
        });
        println!(
            "## Weights and a start rate: ours, medians of {repeats} run(s) per cell, against the same run's plain figures (weight 1 of {})\n",
            load::LIMIT
        );
        print_table(
            "| regime | >contenders | variant | >CS/s | >vs plain | >requests/CS | >vs plain | >acquire p50 / p99 ms | >p99 vs plain | >\"full\" / \"rate limited\" answers/CS | >max weight held | >starts: most in 1 s / 10 s, least spacing ms, achieved /s | >errors |",
            variant_summaries.iter().map(|v| {
                let m = &v.medians;
                let starts = match v.rate_per_s {
                    Some(_) => format!(
                        "{} / {}, {}, {}",
                        v.max_starts_in_1s,
                        v.max_starts_in_10s,
                        v.min_start_spacing_ms
                            .map_or("-".to_owned(), |ms| ms.to_string()),
                        f(v.achieved_start_rate_per_s, 2)
                    ),
                    None => "-".to_owned(),
                };
                vec![
                    v.regime.short().to_owned(),
                    v.contenders.to_string(),
                    v.label.clone(),
                    f(m.throughput_per_s, 1),
                    times(v.throughput_vs_plain),
                    f(m.requests_per_section, 2),
                    times(v.requests_vs_plain),
                    pair(m.acquire_p50_ms, m.acquire_p99_ms, 1),
                    times(v.acquire_p99_vs_plain),
                    pair(m.full_answers_per_section, v.rate_limited_answers_per_section, 2),
                    format!("{} of {}", v.max_weight_seen, v.limit),
                    starts,
                    v.errors_total.to_string(),
                ]
            }),
        );
        self.out.insert(
            "load".into(),
            json!({
                "limit": load::LIMIT,
                "runs": runs,
                "medians": summaries,
                "variants": {
                    "weighted": {"limit": load::WEIGHTED_LIMIT, "weights": load::WEIGHTS},
                    "rate_limited": {
                        "limit": load::LIMIT,
                        "rate_per_s": cli.rate.as_per_second(),
                        "spacing_ms": cli.rate.spacing_ms(),
                    },
                    "runs": variant_runs,
                    "medians": variant_summaries,
                },
            }),
        );
        Ok(())
    }

    /// (c) item size
    async fn size(&mut self) -> Result<()> {
        // The quiet lock reaches its worst case (2 x 8 fences) at its 16th release.
        let (quiet_cycles, cycles, cleanups) = if self.cli.smoke {
            (2 * rule::BUSY_YOUNG_FENCES + 4, 500, 50)
        } else {
            (60, 10_000, 1_000)
        };
        let report = size::run(5, quiet_cycles, cycles, 10.0, cleanups, 10.0, 10).await;
        println!(
            "## Item size: limit {}, default timing (horizon {} s + clock skew {} s = fence window {} s), execution ARNs of {} characters, UUID acquisition ids, simulated time\n",
            report.limit,
            report.horizon_seconds,
            report.clock_skew_seconds,
            report.window_seconds,
            common::ARN_LEN
        );
        println!("A quiet lock ({} critical sections, one a minute, 5 holders), then {} cycles at {} per second (each takes a new execution's slot and releases the oldest), then {} cleanups of ended executions at {} per second:\n", report.quiet.cycles, report.steady.cycles, report.steady.cs_per_second, report.cleanups, report.cleanups_per_second);
        print_table(
            "| phase | >operations | >simulated s | >holders | >fences (young + old) | >bytes | >WCU per write |",
            report.points.iter().map(|p| {
                vec![
                    p.phase.to_owned(),
                    p.operations.to_string(),
                    f(p.simulated_seconds, 0),
                    p.holders.to_string(),
                    format!("{} ({} + {})", p.fences, p.young, p.old),
                    p.bytes.to_string(),
                    p.write_units_per_write.to_string(),
                ]
            }),
        );
        print_table(
            "| lock | >CS/s | >bytes, no fence yet | >max bytes | >model's worst case | >max fences | >WCU per write (max) | >writes/CS | >rotations/CS |",
            [&report.quiet, &report.steady].map(|s| {
                vec![
                    s.lock.to_owned(),
                    f(s.cs_per_second, 3),
                    s.bytes_without_fences.to_string(),
                    s.max_bytes.to_string(),
                    f(s.model_max_bytes, 0),
                    s.max_fences.to_string(),
                    s.max_write_units_per_write.to_string(),
                    f(s.writes_per_section, 3),
                    f(s.rotations_per_section, 3),
                ]
            }),
        );
        let m = &report.model;
        let c = &report.ceiling;
        println!(
            "model: bytes = {} + holders x {} + fences x {} (+ {} once there are fences: the two sets' names and rotated_at); fences <= 2 x max({busy}, r x W + 1) (a release or cleanup rotates once a window has passed and {busy} young fences are kept); the sample: {} + holders x {}",
            m.base_bytes,
            m.holder_bytes,
            m.fence_bytes,
            m.fence_attributes_bytes,
            m.sample_base_bytes,
            m.sample_holder_bytes,
            busy = rule::BUSY_YOUNG_FENCES
        );
        println!(
            "per-lock ceiling on paper: {}\n  => r <= {} CS/s (item {} bytes, {} WCU per write, {} WCU/s); the sample: {} CS/s; the item would reach 400 KB at {} CS/s\n",
            c.formula,
            f(c.cs_per_second, 1),
            f(c.item_bytes_at_ceiling, 0),
            c.write_units_per_write_at_ceiling,
            f(c.wcu_per_second_at_ceiling, 0),
            f(c.sample_cs_per_second, 0),
            f(c.cs_per_second_for_400kb, 0)
        );
        size::check(&report, &mut self.problems);
        self.targets.push(Target {
            target: "a quiet lock with 5 holders <= 1 KB".into(),
            measured: format!(
                "{} bytes at most with {} fences ({} before its first release); the rule's worst case {} fences, {} bytes on the model",
                report.quiet.max_bytes,
                report.quiet.max_fences,
                report.quiet.bytes_without_fences,
                f(
                    rule::worst_fences(
                        report.quiet.cs_per_second,
                        report.window_seconds,
                        rule::BUSY_YOUNG_FENCES
                    ),
                    0
                ),
                f(report.quiet.model_max_bytes, 0)
            ),
            met: report.quiet.max_bytes <= 1024 && report.quiet.model_max_bytes <= 1024.0,
        });
        self.targets.push(Target {
            target: "steady state at 10 CS/s <= 4 KB".into(),
            measured: format!(
                "{} bytes at most, {} WCU per write; the model's worst case {} bytes",
                report.steady.max_bytes,
                report.steady.max_write_units_per_write,
                f(report.steady.model_max_bytes, 0)
            ),
            met: report.steady.max_bytes <= 4096 && report.steady.model_max_bytes <= 4096.0,
        });
        self.targets.push(Target {
            target: "per-lock ceiling on paper >= 50 CS/s at the defaults".into(),
            measured: format!("{} CS/s", f(c.cs_per_second, 1)),
            met: c.cs_per_second >= 50.0,
        });
        self.out.insert("size".into(), json!(report));
        Ok(())
    }

    /// (d) the Lambdas
    async fn lambdas(&mut self) -> Result<()> {
        let cli = &self.cli;
        let repeats = self.repeats;
        let repo = local_aws::server::repo_root();
        let boots = lambdas::bootstraps(&repo);
        println!("## Lambdas\n");
        if boots.is_empty() {
            println!("(no .aws-sam/build/*/bootstrap: run .ci/sam-build.sh for the arm64 sizes)\n");
        }
        let bin_dir = cli.lambda_bin_dir.clone().or_else(lambdas::default_bin_dir);
        let (starts, invocations) = if cli.smoke {
            (1, 2)
        } else {
            (repeats.max(5), 5)
        };
        let handlers = async {
            let dir = bin_dir.context("no directory with the handler binaries")?;
            let topic = sweeper::topic().await?;
            lambdas::run(&dir, &topic, starts, invocations).await
        };
        // A failed run still prints the table's header and writes the bootstraps.
        let handlers = handlers.await;
        let ran = handlers.as_deref().unwrap_or_default();
        let profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        let by_name: BTreeMap<String, &lambdas::Bootstrap> = boots
            .iter()
            .map(|b| (b.function.to_ascii_lowercase().replace("function", ""), b))
            .collect();
        print_table(
            &format!("| function | >arm64 bootstrap (sam build) | >native {profile} binary | >init, median of {starts} starts | >peak RSS after {invocations} invocations, median / max | >128 MB / max |"),
            ran.iter().map(|h| {
                vec![
                    h.function.to_owned(),
                    by_name
                        .get(h.function)
                        .map(|b| format!("{} MiB ({})", f(b.mib, 2), b.machine))
                        .unwrap_or_else(|| "n/a".to_owned()),
                    format!("{} MiB", f(h.binary_bytes as f64 / 1_048_576.0, 2)),
                    format!("{} ms", f(h.init_median_ms, 1)),
                    pair(h.peak_rss_median_mib, h.peak_rss_max_mib, 1) + " MiB",
                    format!("{}x", f(h.headroom_of_128_mb, 1)),
                ]
            }),
        );
        for h in ran
            .iter()
            .filter(|h| h.peak_rss_max_mib >= lambdas::MEMORY_SIZE_MB)
        {
            self.problems
                .push(format!("{}: peak memory over 128 MB", h.function));
        }
        self.out.insert(
            "lambdas".into(),
            json!({"bootstraps": boots, "handlers": ran}),
        );
        handlers.map(|_| ())
    }

    /// (e) the sweeper
    /// Scale (issue #28): locks filled to their limit, ours against the sample's.
    async fn scale(&mut self) -> Result<()> {
        let smoke = self.cli.smoke;
        let limits: &[u32] = if !self.cli.scale_limits.is_empty() {
            &self.cli.scale_limits.clone()
        } else if smoke {
            &[10, 100]
        } else {
            &[10, 100, 1_000, 10_000]
        };
        let sections = if smoke { 3 } else { 20 };
        let rows = scale::run(&self.endpoint, &self.table, limits, sections).await?;
        println!(
            "## Scale: locks filled to their limit by the bench's own clients, {sections} \
             critical sections each at the full lock (issue #28)\n"
        );
        print_table(
            "| >limit | protocol | >holders | >item bytes (gate + holding) | >WCU per write | >WCU per CS | >requests/CS | >acquire p50 / p99 ms | >waited: record bytes | >waited: WCU per CS | >waited: requests/CS | stopped short |",
            rows.iter().map(|r| {
                vec![
                    r.limit.to_string(),
                    r.proto.to_owned(),
                    r.holders.to_string(),
                    if r.holding_bytes > 0 {
                        format!("{} + {}", r.item_bytes, r.holding_bytes)
                    } else {
                        r.item_bytes.to_string()
                    },
                    r.write_units_per_write.to_string(),
                    f(r.write_units_per_section, 1),
                    f(r.requests_per_section, 2),
                    pair(r.acquire_p50_ms, r.acquire_p99_ms, 1),
                    if r.waited_sections > 0 {
                        r.record_bytes.to_string()
                    } else {
                        String::new()
                    },
                    f(r.waited_write_units_per_section, 1),
                    f(r.waited_requests_per_section, 2),
                    r.stopped.clone().unwrap_or_default(),
                ]
            }),
        );
        for r in &rows {
            if r.holders + 1 > r.limit as usize {
                self.problems.push(format!(
                    "scale: {} holds {} of {}",
                    r.proto, r.holders, r.limit
                ));
            }
            if r.proto == "ours" && r.sections > 0 && !(1.9..=2.5).contains(&r.requests_per_section)
            {
                self.problems.push(format!(
                    "scale: ours at limit {} took {:.2} requests per section",
                    r.limit, r.requests_per_section
                ));
            }
        }
        // The gate's point: what a section costs does not grow with the limit.
        let gate: Vec<f64> = rows
            .iter()
            .filter(|r| r.proto == "ours-gate" && r.sections > 0)
            .map(|r| r.write_units_per_section)
            .collect();
        let (least, most) = gate
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, m), &w| (l.min(w), m.max(w)));
        if gate.len() != limits.len() || most - least > 0.5 {
            self.problems.push(format!(
                "scale: the gate's write units per section are not flat in the limit: {gate:?}"
            ));
        }
        self.out.insert("scale".into(), json!(rows));
        Ok(())
    }

    async fn sweeper(&mut self) -> Result<()> {
        let cli = &self.cli;
        let counts: &[usize] = if cli.smoke { &[1, 10] } else { &[1, 10, 100] };
        let rows = sweeper::run(counts).await?;
        println!("## Sweeper: calls per sweep, counted\n");
        print_table(
            "| >holders | sweep | >reclaimed | >Scan | >UpdateItem (fence + free + rotations) | >GetItem | >PutItem | >DescribeExecution | >ListExecutions | >SNS Publish | >DynamoDB total | >Step Functions total | >SNS total |",
            rows.iter().map(|r| {
                let update = format!(
                    "{} ({} + {} + {})",
                    r.update_item, r.cleanup_fence, r.cleanup_free, r.rotations
                );
                vec![
                    r.holders.to_string(),
                    r.case.to_owned(),
                    r.reclaimed.to_string(),
                    r.scan.to_string(),
                    update,
                    r.get_item.to_string(),
                    r.put_item.to_string(),
                    r.describe_execution.to_string(),
                    r.list_executions.to_string(),
                    r.publish.to_string(),
                    r.dynamodb_total.to_string(),
                    r.step_functions_total.to_string(),
                    r.sns_total.to_string(),
                ]
            }),
        );
        sweeper::check(&rows, &mut self.problems);
        self.out.insert("sweeper".into(), json!(rows));
        Ok(())
    }
}
