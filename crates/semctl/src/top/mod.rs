//! `semctl top`: a live view of every lock in the table (see [`view`] for what it shows and
//! [`read`](mod@read) for what it reads), or one frame with `--once`, printed like any command's
//! output: on a terminal at its width and in colour, otherwise as plain text.
//!
//! The live screen (ratatui, alternate screen, raw mode) is restored however the view ends: a
//! key (in raw mode Ctrl-C is a key, not a signal), SIGTERM or SIGHUP, a terminal error or a
//! panic. A failed refresh keeps the last frame with the failure named under it; only the first
//! reading's failure ends the command, before the screen is touched.

mod read;
mod view;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;
use semaphore_core::{DynamoStore, Semaphore, StoreError};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use read::{read, Reading};
use view::{plain_text, write_styled, Starts, View};

/// The width of `--once`'s text when stdout is not a terminal.
const TEXT_WIDTH: u16 = 100;

/// The shortest and longest refresh interval `--interval` takes, in seconds: a Scan of the whole
/// table per refresh, so not faster than twice a second; and the seen start rates look back
/// [`view::SEEN_WINDOW`], so no slower than that.
pub const INTERVAL_RANGE: (f64, f64) = (0.5, 10.0);

#[derive(clap::Args)]
pub struct Options {
    /// Print one frame and exit (for scripts): on a terminal at its width and in colour,
    /// otherwise plain text without escape codes, 100 columns wide. Exit 1 if an item could
    /// not be read (it is shown with its error, the other locks as usual).
    #[arg(long)]
    pub once: bool,
    /// Seconds between refreshes: a number from 0.5 to 10.
    #[arg(long, value_name = "SECONDS", default_value = "1", allow_hyphen_values = true,
          value_parser = refresh_interval)]
    pub interval: Duration,
    /// Holders listed under each lock, the longest held first (the others are counted).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub holders: usize,
}

fn refresh_interval(text: &str) -> Result<Duration, String> {
    let (least, most) = INTERVAL_RANGE;
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|secs| (least..=most).contains(secs))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("expected seconds from {least} to {most}"))
}

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(
        "`semctl top` draws on a terminal and stdout is not one: pass --once for one frame as \
         plain text"
    )]
    NotATerminal,
    #[error("the terminal: {0}")]
    Terminal(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Runs the view; answers why the exit status is 1 although it ran (`--once` met items it
/// cannot read: it shows them, and the others).
pub async fn run(
    semaphore: &Semaphore<DynamoStore>,
    options: &Options,
) -> Result<Option<String>, TopError> {
    if !options.once && !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    // Before the screen is touched: a table or endpoint that is not there is a plain error.
    let first = read(semaphore).await?;
    let mut starts = Starts::default();
    starts.observe(&first);
    let table = semaphore.store().table();
    if options.once {
        let mut view = View::new(table, options.holders, None);
        view.show(&first, &starts);
        if std::io::stdout().is_terminal() {
            let width =
                ratatui::crossterm::terminal::size().map_or(TEXT_WIDTH, |(columns, _)| columns);
            write_styled(&view, width, &mut std::io::stdout().lock())
                .map_err(TopError::Terminal)?;
        } else {
            print!("{}", plain_text(&view, TEXT_WIDTH));
        }
        let unreadable = first.unreadable();
        return Ok((!unreadable.is_empty()).then(|| {
            format!(
                "some items could not be read ({}, shown in the frame): {}",
                unreadable.len(),
                unreadable.join("; ")
            )
        }));
    }
    let mut view = View::new(table, options.holders, Some(options.interval));
    view.show(&first, &starts);
    let shown = match ratatui::try_init() {
        Ok(mut terminal) => live(&mut terminal, semaphore, options, view, starts).await,
        Err(e) => Err(TopError::Terminal(e)),
    };
    // Also after a failed init, which may have switched raw mode on before failing.
    let restored = ratatui::try_restore().map_err(TopError::Terminal);
    shown.and(restored).map(|()| None)
}

/// The live screen, until a key or a signal ends it.
async fn live(
    terminal: &mut DefaultTerminal,
    semaphore: &Semaphore<DynamoStore>,
    options: &Options,
    mut view: View,
    mut starts: Starts,
) -> Result<(), TopError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut keys = input(stop.clone());
    let (readings_tx, mut readings) = mpsc::channel::<Result<Reading, StoreError>>(1);
    let refresher = tokio::spawn(refresh(semaphore.clone(), options.interval, readings_tx));
    let mut term = signal(SignalKind::terminate()).map_err(TopError::Terminal)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(TopError::Terminal)?;
    let result = loop {
        if let Err(e) = terminal.draw(|frame| frame.render_widget(&view, frame.area())) {
            break Err(TopError::Terminal(e));
        }
        tokio::select! {
            event = keys.recv() => match event {
                Some(Ok(Event::Key(key))) if key.kind == KeyEventKind::Press => {
                    if quits(&key) {
                        break Ok(());
                    }
                    match key.code {
                        KeyCode::Down | KeyCode::Char('j') => view.scroll_by(1),
                        KeyCode::Up | KeyCode::Char('k') => view.scroll_by(-1),
                        KeyCode::Home => view.scroll = 0,
                        _ => {}
                    }
                }
                // A resize, or anything else: the loop draws again at the new size.
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(TopError::Terminal(e)),
                None => break Err(TopError::Terminal(std::io::Error::other("input closed"))),
            },
            reading = readings.recv() => match reading {
                Some(Ok(reading)) => {
                    starts.observe(&reading);
                    view.show(&reading, &starts);
                }
                Some(Err(e)) => view.failure = Some((semaphore.now_ms(), e.to_string())),
                None => break Ok(()),
            },
            _ = term.recv() => break Ok(()),
            _ = hangup.recv() => break Ok(()),
        }
    };
    refresher.abort();
    stop.store(true, Ordering::Relaxed);
    result
}

fn quits(key: &KeyEvent) -> bool {
    matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
        || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL))
}

/// Reads the table every `interval` after the first reading, until the receiver is gone.
async fn refresh(
    semaphore: Semaphore<DynamoStore>,
    interval: Duration,
    readings: mpsc::Sender<Result<Reading, StoreError>>,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    // A slow Scan delays the next one rather than sending a burst to catch up.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if readings.send(read(&semaphore).await).await.is_err() {
            return;
        }
    }
}

/// The terminal's events, read on a thread of their own (crossterm's reads block), until `stop`.
fn input(stop: Arc<AtomicBool>) -> mpsc::UnboundedReceiver<std::io::Result<Event>> {
    let (events, received) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            // Polled, not read: the thread looks at `stop` at least every 100 ms, so it stops
            // reading the terminal soon after the view ended.
            let event = match event::poll(Duration::from_millis(100)) {
                Ok(false) => continue,
                Ok(true) => event::read(),
                Err(e) => Err(e),
            };
            let failed = event.is_err();
            if events.send(event).is_err() || failed {
                return;
            }
        }
    });
    received
}
