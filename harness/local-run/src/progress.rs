//! The live view: one status line, redrawn in place on a terminal, printed every few seconds
//! (and when it changes) otherwise. Goes to stderr; the report goes to stdout.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Progress {
    stop: Arc<AtomicBool>,
    handle: Option<tokio::task::JoinHandle<()>>,
    tty: bool,
}

impl Progress {
    pub fn start(status: impl Fn() -> String + Send + 'static) -> Self {
        let tty = std::io::stderr().is_terminal();
        let stop = Arc::new(AtomicBool::new(false));
        let task_stop = stop.clone();
        let handle = tokio::spawn(async move {
            let started = Instant::now();
            let mut last_line = String::new();
            let mut last_print = Instant::now() - Duration::from_secs(60);
            while !task_stop.load(Ordering::SeqCst) {
                let line = format!("[{:>4.0}s] {}", started.elapsed().as_secs_f64(), status());
                {
                    let mut err = std::io::stderr().lock();
                    if tty {
                        let _ = write!(err, "\r\x1b[2K{line}");
                        let _ = err.flush();
                    } else {
                        let changed = line.split_once(']').map(|x| x.1)
                            != last_line.split_once(']').map(|x| x.1);
                        if changed && last_print.elapsed() >= Duration::from_secs(5) {
                            let _ = writeln!(err, "{line}");
                            last_print = Instant::now();
                        }
                    }
                }
                last_line = line;
                tokio::time::sleep(Duration::from_millis(if tty { 250 } else { 500 })).await;
            }
            if tty {
                let _ = writeln!(std::io::stderr(), "\r\x1b[2K{last_line}");
            } else {
                let _ = writeln!(std::io::stderr(), "{last_line}");
            }
        });
        Self {
            stop,
            handle: Some(handle),
            tty,
        }
    }

    /// Prints a line above the status line.
    pub fn note(&self, text: &str) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = writeln!(err, "\r\x1b[2K{text}");
        } else {
            let _ = writeln!(err, "{text}");
        }
    }

    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

/// Prints a phase line (before or after the live view).
pub fn phase(text: &str) {
    eprintln!("==> {text}");
}
