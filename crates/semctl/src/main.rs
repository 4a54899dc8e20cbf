//! `semctl`: inspect and operate a semaphore table by hand.
//!
//! Output is JSON on stdout. Exit status: 0 done, 2 the lock is full or its start rate is spent,
//! 3 fenced (this acquisition was released or its execution cleaned up), 4 expired (asked longer
//! ago than the acquire horizon: nothing taken, run it again), 1 any error (message on stderr;
//! nothing written on bad input). `top` draws a live view on the terminal instead.
//!
//! `list`, `sweep` and `release --all-of` without `--lock` go over the whole table: an item they
//! cannot read (of another format, say) is named in their output and on stderr with exit 1, and
//! the other locks are done anyway, so that a script notices and one bad item never hides the
//! rest from an operator.

mod cli;
mod commands;
mod output;
mod top;

use std::process::ExitCode;

use clap::Parser;
use semaphore_core::{Clock, SystemClock};

use crate::cli::Cli;
use crate::commands::run;
use crate::output::Failure;

fn main() -> ExitCode {
    // The acquire's request time: when the operator asked, before anything else ran. A fence
    // written after this moment is one the acquire must meet (see `Timing`).
    let requested_at_ms = SystemClock.now_ms();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap exits 2 on a usage error, which here means "full"; report it as an error.
            let _ = e.print();
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SEMCTL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let max_attempts = cli.max_attempts;
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::Runtime)
        .and_then(|runtime| runtime.block_on(run(cli, requested_at_ms)));
    match answer {
        Ok(answer) => {
            if let Some(output) = &answer.output {
                println!(
                    "{}",
                    serde_json::to_string_pretty(output).unwrap_or_default()
                );
            }
            if let Some(problem) = answer.problem {
                eprintln!("semctl: error: {problem}");
            }
            ExitCode::from(answer.code)
        }
        Err(e) => {
            eprintln!("semctl: error: {e}");
            if let Some(undone) = e.left_undone(max_attempts) {
                eprintln!("semctl: {undone}");
            }
            ExitCode::FAILURE
        }
    }
}
