//! `bench`: our protocol against the original AWS sample's, side by side, in one run against the
//! same local server; plus the item size, the Lambdas and the sweeper. Writes every number to a
//! JSON file and prints the tables BENCHMARKS.md quotes. Exits 1 if any number is not sane
//! (a count that must be exact is not, a section did not finish, more than `limit` holders).
//!
//! The local server (moto behind one lock) serves one request at a time: every throughput and
//! latency figure is bounded by it, and compares the protocols' request patterns, not AWS.

mod common;
mod lambdas;
mod load;
mod requests;
mod size;
mod stats;
mod sweeper;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

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
    /// Only these parts (comma-separated): requests, load, size, lambdas, sweeper.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Where the natively built handler binaries are (default: next to this binary).
    #[arg(long)]
    lambda_bin_dir: Option<PathBuf>,
}

#[derive(Serialize)]
struct LoadSummary {
    regime: Regime,
    proto: Proto,
    contenders: usize,
    runs: usize,
    throughput_per_s: f64,
    throughput_vs_reference: f64,
    acquire_p50_ms: f64,
    acquire_p99_ms: f64,
    release_p50_ms: f64,
    release_p99_ms: f64,
    requests_per_section: f64,
    requests_vs_reference: f64,
    failed_writes_per_section: f64,
    full_answers_per_section: f64,
    contention_errors_total: u64,
    item_bytes_at_end: f64,
}

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let mem = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .unwrap_or("")
        .to_owned();
    let moto = read(
        &semaphore_tests::server::repo_root()
            .join("local/requirements.txt")
            .to_string_lossy(),
    )
    .lines()
    .find(|l| l.starts_with("moto"))
    .unwrap_or("")
    .to_owned();
    let date = semaphore_core::rfc3339_millis(semaphore_core::SystemClock.now_ms());
    json!({
        "date": date,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "memory": mem,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "server": format!("{moto} behind local/moto_server.py (one request at a time), on 127.0.0.1"),
        "endpoint": semaphore_tests::endpoint(),
    })
}

/// Records how long one part took, and says so on stderr.
fn part_done(timings: &mut serde_json::Map<String, Value>, part: &str, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    timings.insert(part.into(), json!(seconds));
    eprintln!("{part}: {seconds:.1} s");
}

fn f(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".to_owned()
    } else {
        format!("{x:.digits$}")
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let wanted = |part: &str| cli.only.is_empty() || cli.only.iter().any(|p| p == part);
    let repeats = cli.repeats.unwrap_or(if cli.smoke { 1 } else { 5 });
    let started = Instant::now();
    let mut problems: Vec<String> = Vec::new();
    let mut out = serde_json::Map::new();
    let mut timings = serde_json::Map::new();
    out.insert("smoke".into(), json!(cli.smoke));
    out.insert("repeats".into(), json!(repeats));
    out.insert("machine".into(), machine());
    let endpoint = semaphore_tests::endpoint().to_owned();
    let table = semaphore_tests::fresh_table().await.table().to_owned();
    println!(
        "# semaphore bench{}\n",
        if cli.smoke { " (smoke)" } else { "" }
    );
    println!(
        "server: {}\n",
        out["machine"]["server"].as_str().unwrap_or_default()
    );

    // (a) requests per uncontended critical section
    if wanted("requests") {
        let part_started = Instant::now();
        let sections = if cli.smoke { 5 } else { 50 };
        let rows = requests::run(&endpoint, &table, sections).await;
        let reference = rows
            .iter()
            .find(|r| r.scenario.starts_with("AWS sample"))
            .map(|r| r.requests_per_section)
            .unwrap_or(f64::NAN);
        println!("## DynamoDB requests per uncontended critical section (acquire + release), {sections} sections each, counted\n");
        println!("| scenario | requests | GetItem | PutItem | UpdateItem | failed conditional writes | vs sample |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for r in &rows {
            println!(
                "| {} | {} | {} | {} | {} | {} | {}x |",
                r.scenario,
                f(r.requests_per_section, 2),
                f(r.get_item, 2),
                f(r.put_item, 2),
                f(r.update_item, 2),
                f(r.failed_conditional_writes, 2),
                f(ratio(r.requests_per_section, reference), 2)
            );
        }
        println!();
        let exact = |scenario: &str, want: (f64, f64, f64)| {
            rows.iter()
                .find(|r| r.scenario.starts_with(scenario))
                .map(|r| (r.get_item, r.put_item, r.update_item) == want)
                .unwrap_or(false)
        };
        if !exact("ours: one process, item cache", (0.0, 2.0, 0.0)) {
            problems.push(
                "ours with the item cache must be exactly 2 PutItem per uncontended section".into(),
            );
        }
        if !exact("ours: one process, read first", (2.0, 2.0, 0.0)) {
            problems.push("ours reading first must be exactly 2 GetItem + 2 PutItem".into());
        }
        if !exact("AWS sample", (0.0, 0.0, 2.0)) {
            problems.push("the sample must be exactly 2 UpdateItem per section".into());
        }
        out.insert("requests".into(), json!(rows));
        part_done(&mut timings, "requests", part_started);
    }

    // (b) latency and throughput under contention
    if wanted("load") {
        let part_started = Instant::now();
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
        let protos = [Proto::Ours, Proto::OursReadFirst, Proto::Reference];
        let mut runs: Vec<load::LoadRun> = Vec::new();
        for rep in 0..repeats {
            for regime in regimes {
                for &(contenders, sections) in plan(regime) {
                    // Rotate the order so that no protocol always runs first (or last).
                    for k in 0..protos.len() {
                        let proto = protos[(k + rep) % protos.len()];
                        match load::run(regime, proto, contenders, sections, &endpoint, &table)
                            .await
                        {
                            Ok(run) => {
                                eprintln!(
                                    "load rep {rep} {:<17} C={contenders:<2} {:<34} {:>7.1} CS/s  acquire p50 {:>7.1} ms  req/CS {:.2}",
                                    regime.short(),
                                    proto.label(),
                                    run.throughput_per_s,
                                    run.acquire_p50_ms,
                                    run.requests_per_section
                                );
                                runs.push(run);
                            }
                            Err(e) => problems.push(e),
                        }
                    }
                }
            }
        }
        let mut summaries = Vec::new();
        for regime in regimes {
            for &(contenders, _) in plan(regime) {
                let of = |proto: Proto| -> Vec<&load::LoadRun> {
                    runs.iter()
                        .filter(|r| {
                            r.regime == regime && r.proto == proto && r.contenders == contenders
                        })
                        .collect()
                };
                let med = |rs: &[&load::LoadRun], g: fn(&load::LoadRun) -> f64| {
                    median(&rs.iter().map(|r| g(r)).collect::<Vec<_>>()).unwrap_or(f64::NAN)
                };
                let reference = of(Proto::Reference);
                let ref_tp = med(&reference, |r| r.throughput_per_s);
                let ref_req = med(&reference, |r| r.requests_per_section);
                for proto in protos {
                    let rs = of(proto);
                    if rs.is_empty() {
                        continue;
                    }
                    let tp = med(&rs, |r| r.throughput_per_s);
                    let req = med(&rs, |r| r.requests_per_section);
                    summaries.push(LoadSummary {
                        regime,
                        proto,
                        contenders,
                        runs: rs.len(),
                        throughput_per_s: tp,
                        throughput_vs_reference: ratio(tp, ref_tp),
                        acquire_p50_ms: med(&rs, |r| r.acquire_p50_ms),
                        acquire_p99_ms: med(&rs, |r| r.acquire_p99_ms),
                        release_p50_ms: med(&rs, |r| r.release_p50_ms),
                        release_p99_ms: med(&rs, |r| r.release_p99_ms),
                        requests_per_section: req,
                        requests_vs_reference: ratio(req, ref_req),
                        failed_writes_per_section: med(&rs, |r| r.failed_writes_per_section),
                        full_answers_per_section: med(&rs, |r| r.full_answers_per_section),
                        contention_errors_total: rs.iter().map(|r| r.contention_errors).sum(),
                        item_bytes_at_end: med(&rs, |r| r.item_bytes_at_end as f64),
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
            println!("| contenders | protocol | CS/s | vs sample | acquire p50 / p99 ms | release p50 / p99 ms | requests/CS | vs sample | failed cond. writes/CS | \"full\" answers/CS | Contention errors (all runs) | item bytes at end |");
            println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for s in summaries.iter().filter(|s| s.regime == regime) {
                println!(
                    "| {} | {} | {} | {}x | {} / {} | {} / {} | {} | {}x | {} | {} | {} | {} |",
                    s.contenders,
                    s.proto.label(),
                    f(s.throughput_per_s, 1),
                    f(s.throughput_vs_reference, 2),
                    f(s.acquire_p50_ms, 1),
                    f(s.acquire_p99_ms, 1),
                    f(s.release_p50_ms, 1),
                    f(s.release_p99_ms, 1),
                    f(s.requests_per_section, 2),
                    f(s.requests_vs_reference, 2),
                    f(s.failed_writes_per_section, 2),
                    f(s.full_answers_per_section, 2),
                    s.contention_errors_total,
                    f(s.item_bytes_at_end, 0)
                );
                if s.throughput_per_s.is_nan() || s.throughput_per_s <= 0.0 {
                    problems.push(format!(
                        "{} C={}: no throughput",
                        s.proto.label(),
                        s.contenders
                    ));
                }
            }
            println!();
        }
        out.insert(
            "load".into(),
            json!({"limit": load::LIMIT, "runs": runs, "medians": summaries}),
        );
        part_done(&mut timings, "load", part_started);
    }

    // (c) item size
    if wanted("size") {
        let part_started = Instant::now();
        let (cycles, cleanups) = if cli.smoke {
            (500, 50)
        } else {
            (10_000, 1_000)
        };
        let report = size::run(5, cycles, 10.0, cleanups, 10.0, 10).await;
        println!(
            "## Item size: limit {}, {} acquire/release cycles then {} cleanups, both at {} per simulated second, fence window {} s\n",
            report.limit, report.cycles, report.cleanups, report.cycles_per_second, report.fence_window_seconds
        );
        println!("| phase | operations | simulated s | holders | live fences | bytes | WCU per PutItem | RCU per GetItem |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for p in &report.points {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                p.phase,
                p.operations,
                f(p.simulated_seconds, 0),
                p.holders,
                p.live_fences,
                p.bytes,
                p.write_units_per_put,
                p.read_units_per_get
            );
        }
        let m = &report.model;
        println!(
            "\nmodel: bytes = {} + holders x {} + fences x {} (fences = fencing writes/s x {} s); the sample: {} + holders x {}; the item reaches 400 KB at {} fencing writes/s per lock\n",
            m.base_bytes,
            m.holder_bytes,
            m.fence_bytes,
            report.fence_window_seconds,
            m.sample_base_bytes,
            m.sample_holder_bytes,
            f(report.max_fencing_rate_per_second_for_400kb, 1)
        );
        if let Some(last) = report.points.last() {
            // Expired fences must be gone and live ones kept (each release and cleanup fences
            // a distinct identity).
            if last.live_fences != report.expected_live_fences {
                problems.push(format!(
                    "item size: {} live fences at the end, expected {}",
                    last.live_fences, report.expected_live_fences
                ));
            }
        }
        out.insert("size".into(), json!(report));
        part_done(&mut timings, "size", part_started);
    }

    // (d) the Lambdas
    if wanted("lambdas") {
        let part_started = Instant::now();
        let repo = semaphore_tests::server::repo_root();
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
        let handlers = match (bin_dir, sweeper::topic().await) {
            (Some(dir), Ok(topic)) => match lambdas::run(&dir, &topic, starts, invocations).await {
                Ok(h) => h,
                Err(e) => {
                    problems.push(format!("lambdas: {e}"));
                    Vec::new()
                }
            },
            (None, _) => {
                problems.push("lambdas: no directory with the handler binaries".into());
                Vec::new()
            }
            (_, Err(e)) => {
                problems.push(format!("lambdas: {e}"));
                Vec::new()
            }
        };
        let profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        println!("| function | arm64 bootstrap (sam build) | native {profile} binary | init, median of {starts} starts | peak RSS after {invocations} invocations, median / max | 128 MB / max |");
        println!("|---|---:|---:|---:|---:|---:|");
        let by_name: BTreeMap<String, &lambdas::Bootstrap> = boots
            .iter()
            .map(|b| (b.function.to_ascii_lowercase().replace("function", ""), b))
            .collect();
        for h in &handlers {
            let boot = by_name
                .get(h.function)
                .map(|b| format!("{} MiB ({})", f(b.mib, 2), b.machine))
                .unwrap_or_else(|| "n/a".to_owned());
            println!(
                "| {} | {} | {} MiB | {} ms | {} / {} MiB | {}x |",
                h.function,
                boot,
                f(h.binary_bytes as f64 / 1_048_576.0, 2),
                f(h.init_median_ms, 1),
                f(h.peak_rss_median_mib, 1),
                f(h.peak_rss_max_mib, 1),
                f(h.headroom_of_128_mb, 1)
            );
            if h.peak_rss_max_mib >= lambdas::MEMORY_SIZE_MB {
                problems.push(format!("{}: peak memory over 128 MB", h.function));
            }
        }
        println!();
        out.insert(
            "lambdas".into(),
            json!({"bootstraps": boots, "handlers": handlers}),
        );
        part_done(&mut timings, "lambdas", part_started);
    }

    // (e) the sweeper
    if wanted("sweeper") {
        let part_started = Instant::now();
        let counts: &[usize] = if cli.smoke { &[1, 10] } else { &[1, 10, 100] };
        match sweeper::run(counts).await {
            Ok(rows) => {
                println!("## Sweeper: calls per sweep, counted\n");
                println!("| holders | sweep | reclaimed | Scan | GetItem | PutItem | DescribeExecution | SNS Publish | DynamoDB total | Step Functions total | SNS total |");
                println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
                for r in &rows {
                    println!(
                        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        r.holders,
                        r.case,
                        r.reclaimed,
                        r.scan,
                        r.get_item,
                        r.put_item,
                        r.describe_execution,
                        r.publish,
                        r.dynamodb_total,
                        r.step_functions_total,
                        r.sns_total
                    );
                    let n = r.holders as u64;
                    let reclaiming = r.case.starts_with("all ABORTED");
                    let want_put = if reclaiming { n } else { 0 };
                    let want_get = if reclaiming && r.case.contains("cache off") {
                        n
                    } else {
                        0
                    };
                    if r.describe_execution != n
                        || r.put_item != want_put
                        || r.get_item != want_get
                        || r.publish != want_put
                        || r.reclaimed as u64 != want_put
                        || r.scan != 1
                    {
                        problems.push(format!("sweeper counts not as expected: {r:?}"));
                    }
                }
                println!();
                out.insert("sweeper".into(), json!(rows));
            }
            Err(e) => problems.push(format!("sweeper: {e}")),
        }
        part_done(&mut timings, "sweeper", part_started);
    }

    let elapsed = started.elapsed().as_secs_f64();
    out.insert("wall_seconds".into(), json!(elapsed));
    out.insert("part_seconds".into(), Value::Object(timings));
    out.insert("problems".into(), json!(problems));
    let written = serde_json::to_string_pretty(&Value::Object(out))
        .map_err(|e| e.to_string())
        .and_then(|text| std::fs::write(&cli.out, text + "\n").map_err(|e| e.to_string()));
    if let Err(e) = written {
        eprintln!("cannot write {}: {e}", cli.out.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {} in {elapsed:.1} s", cli.out.display());
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("PROBLEM: {p}");
        }
        ExitCode::FAILURE
    }
}
