//! One frame of `semctl top`: what a reading shows ([`View`]) and how it is drawn, the same for
//! the live screen and for `--once`'s text.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ratatui::backend::IntoCrossterm;
use ratatui::buffer::{Buffer, Cell};
use ratatui::crossterm::queue;
use ratatui::crossterm::style::{Print, PrintStyledContent, StyledContent};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{LineGauge, Paragraph, Widget, Wrap};
use semaphore_core::{rfc3339_millis, LockName, Rate};

use super::read::{Entry, LockRead, Reading};

/// How far back `seen` start rates look.
pub const SEEN_WINDOW: Duration = Duration::from_secs(10);

/// The acquisitions seen lately, per lock, for the start rate of a lock that sets none: every
/// holder any refresh found (its fencing token, unique per acquisition of a lock), kept while
/// it started within [`SEEN_WINDOW`]. A lower bound: an acquisition taken and freed between two
/// refreshes is never seen.
#[derive(Default)]
pub struct Starts {
    seen: HashMap<LockName, BTreeMap<u64, u64>>,
}

impl Starts {
    pub fn observe(&mut self, reading: &Reading) {
        let since = reading.at_ms.saturating_sub(SEEN_WINDOW.as_millis() as u64);
        for entry in &reading.entries {
            if let Entry::Lock(read) = entry {
                let seen = self.seen.entry(read.item.lock.clone()).or_default();
                for holding in read.item.holders.values() {
                    seen.insert(holding.token.0, holding.acquired_at_ms);
                }
            }
        }
        for seen in self.seen.values_mut() {
            seen.retain(|_, started_at_ms| *started_at_ms > since);
        }
        self.seen.retain(|_, seen| !seen.is_empty());
    }

    /// Acquisitions of `lock` per second over the window.
    pub fn per_second(&self, lock: &LockName) -> f64 {
        let count = self.seen.get(lock).map_or(0, BTreeMap::len);
        count as f64 / SEEN_WINDOW.as_secs_f64()
    }
}

/// A lock's start rate, and which one it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StartRate {
    /// The rate the lock's last acquisition set (what DynamoDB enforces).
    Set(Rate),
    /// Acquisitions per second seen lately (see [`Starts`]).
    Seen(f64),
}

impl std::fmt::Display for StartRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartRate::Set(rate) => write!(f, "{rate} set"),
            StartRate::Seen(per_second) => write!(f, "{per_second:.1}/s seen"),
        }
    }
}

pub struct HolderRow {
    /// The holder map's key: `<holder>#<acquisition>`.
    pub name: String,
    pub weight: u32,
    pub held_ms: u64,
    /// How long its lease has left (F13); `None`: held until released.
    pub lease_left_ms: Option<u64>,
}

pub struct LockRow {
    pub name: String,
    pub used: u64,
    pub limit: Option<u32>,
    /// The limit is its operator's configuration (F14), not the last acquisition's.
    pub configured: bool,
    /// Every holder, the longest held first.
    pub holders: Vec<HolderRow>,
    pub waiting: u64,
    pub oldest_wait_ms: Option<u64>,
    pub rate: StartRate,
    pub problem: Option<String>,
}

pub enum Row {
    Lock(LockRow),
    Unreadable { lock: Option<String>, error: String },
}

/// Everything one frame shows.
pub struct View {
    pub table: String,
    /// When the locks shown were read.
    pub at_ms: u64,
    pub rows: Vec<Row>,
    /// Holders listed under each lock.
    pub holders_shown: usize,
    /// The live screen's refresh interval and key help; `None` for `--once`.
    pub live: Option<Duration>,
    /// The last refresh's failure (when, why) while an older reading is shown.
    pub failure: Option<(u64, String)>,
    /// Locks scrolled past at the top.
    pub scroll: usize,
}

impl View {
    pub fn new(table: &str, holders_shown: usize, live: Option<Duration>) -> Self {
        Self {
            table: table.to_owned(),
            at_ms: 0,
            rows: Vec::new(),
            holders_shown,
            live,
            failure: None,
            scroll: 0,
        }
    }

    /// Shows `reading`, with start rates from `starts` (which has observed it).
    pub fn show(&mut self, reading: &Reading, starts: &Starts) {
        self.at_ms = reading.at_ms;
        self.failure = None;
        self.rows = reading
            .entries
            .iter()
            .map(|entry| match entry {
                Entry::Lock(read) => Row::Lock(lock_row(read, reading.at_ms, starts)),
                Entry::Unreadable { lock, error } => Row::Unreadable {
                    lock: lock.clone(),
                    error: error.clone(),
                },
            })
            .collect();
        self.scroll = self.scroll.min(self.rows.len().saturating_sub(1));
    }

    pub fn scroll_by(&mut self, locks: isize) {
        let last = self.rows.len().saturating_sub(1);
        self.scroll = self.scroll.saturating_add_signed(locks).min(last);
    }

    /// Lines the whole frame takes (what `--once` prints).
    pub fn height(&self) -> u16 {
        let body: usize = self.rows.iter().map(|row| self.row_lines(row)).sum();
        u16::try_from(HEADER_LINES + body.max(1) + FOOTER_LINES).unwrap_or(u16::MAX)
    }

    fn row_lines(&self, row: &Row) -> usize {
        match row {
            Row::Lock(lock) => {
                let listed = lock.holders.len().min(self.holders_shown);
                1 + listed
                    + usize::from(lock.holders.len() > listed)
                    + usize::from(lock.problem.is_some())
            }
            Row::Unreadable { .. } => 1,
        }
    }
}

fn lock_row(read: &LockRead, now_ms: u64, starts: &Starts) -> LockRow {
    let item = &read.item;
    let mut holders: Vec<HolderRow> = item
        .holders
        .iter()
        .map(|(identity, holding)| HolderRow {
            name: identity.slot_key(),
            weight: holding.weight.get(),
            held_ms: now_ms.saturating_sub(holding.acquired_at_ms),
            lease_left_ms: item
                .leases
                .get(identity)
                .map(|until| until.saturating_sub(now_ms)),
        })
        .collect();
    holders.sort_by(|a, b| b.held_ms.cmp(&a.held_ms).then_with(|| a.name.cmp(&b.name)));
    LockRow {
        name: item.lock.to_string(),
        used: item.used,
        limit: item
            .config
            .map(|config| config.limit)
            .or(item.limit)
            .map(|limit| limit.get()),
        configured: item.config.is_some(),
        holders,
        waiting: item.waiting,
        oldest_wait_ms: read
            .oldest_queued_at_ms
            .map(|queued_at_ms| now_ms.saturating_sub(queued_at_ms)),
        rate: match item.rate {
            Some(rate) => StartRate::Set(rate),
            None => StartRate::Seen(starts.per_second(&item.lock)),
        },
        problem: read.problem.clone(),
    }
}

/// The title line and the column headings.
const HEADER_LINES: usize = 2;
/// The legend (and, live, the keys).
const FOOTER_LINES: usize = 1;

/// An age as a person reads it: 12s, 4m05s, 2h03m, 3d04h.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `text` in at most `width` columns, cut at the front (an execution ARN's end names it).
fn tail(text: &str, width: usize) -> String {
    let chars = text.chars().count();
    if chars <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let kept: String = text.chars().skip(chars - (width - 1)).collect();
    format!("…{kept}")
}

/// The columns after the lock's name and its bar.
const COLUMNS: [(&str, u16); 4] = [
    ("HOLDERS", 7),
    ("WAITING", 7),
    ("OLDEST WAIT", 11),
    ("START RATE", 14),
];

/// Where each column of a lock's line is, across `area`'s width.
struct Columns {
    name: Rect,
    bar: Rect,
    rest: [Rect; 4],
}

impl Columns {
    fn new(area: Rect, name_width: u16) -> Self {
        let constraints = [Constraint::Length(name_width), Constraint::Fill(1)]
            .into_iter()
            .chain(COLUMNS.map(|(_, width)| Constraint::Length(width)));
        let [name, bar, rest @ ..]: [Rect; 6] = Layout::horizontal(constraints)
            .spacing(1)
            .areas(Rect { height: 1, ..area });
        Self { name, bar, rest }
    }

    fn at(&self, y: u16) -> Self {
        let row = |rect: Rect| Rect { y, ..rect };
        Self {
            name: row(self.name),
            bar: row(self.bar),
            rest: self.rest.map(row),
        }
    }
}

impl Widget for &View {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.is_empty() {
            return;
        }
        // A failure is said in full under the frame, on as many lines as it takes.
        let failure = self.failure.as_ref().map(|(at_ms, why)| {
            let time = rfc3339_millis(*at_ms);
            let text = format!(
                "refresh at {} UTC failed: {why}; showing the frame read before",
                time.get(11..19).unwrap_or(&time)
            );
            let lines = text
                .chars()
                .count()
                .div_ceil(usize::from(area.width.max(1)));
            (text, (lines as u16 + 1).min(area.height / 3))
        });
        let [title, headings, body, failed, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Fill(1),
            Constraint::Length(failure.as_ref().map_or(0, |(_, lines)| *lines)),
            Constraint::Length(1),
        ])
        .areas(area);
        if let Some((text, _)) = failure {
            Paragraph::new(text)
                .red()
                .bold()
                .wrap(Wrap { trim: true })
                .render(failed, buf);
        }
        self.title().render(title, buf);

        let longest = self
            .rows
            .iter()
            .map(|row| match row {
                Row::Lock(lock) => lock.name.chars().count(),
                Row::Unreadable { lock, .. } => lock.as_deref().map_or(1, |l| l.chars().count()),
            })
            .max()
            .unwrap_or(0);
        let name_width = (longest.clamp(4, 32) as u16).min(area.width / 3);
        let columns = Columns::new(headings, name_width);
        let heading = Style::new().add_modifier(Modifier::BOLD);
        Span::styled("LOCK", heading).render(columns.name, buf);
        Span::styled("USED / LIMIT", heading).render(columns.bar, buf);
        for ((text, _), rect) in COLUMNS.iter().zip(columns.rest) {
            Span::styled(*text, heading).render(rect, buf);
        }

        let mut y = body.y;
        let mut hidden = 0;
        for row in self.rows.iter().skip(self.scroll) {
            if hidden > 0 || y + self.row_lines(row) as u16 > body.bottom() {
                hidden += 1;
                continue;
            }
            y = self.draw_row(row, &columns.at(y), body, buf);
        }
        if self.rows.is_empty() {
            Line::from("no locks in the table yet: a lock's item is written by its first acquire")
                .italic()
                .render(Rect { y: body.y, ..body }, buf);
        }
        self.footer(hidden).render(footer, buf);
    }
}

impl View {
    fn title(&self) -> Line<'_> {
        let time = rfc3339_millis(self.at_ms);
        let clock = time.get(11..19).unwrap_or(&time);
        let mut spans = vec![
            "semctl top".bold(),
            Span::raw(format!(
                "  table {}  {} lock{}  {clock} UTC",
                self.table,
                self.rows.len(),
                if self.rows.len() == 1 { "" } else { "s" }
            )),
        ];
        if let Some(interval) = self.live {
            spans.push(Span::raw(format!(
                "  every {}",
                humantime_secs(interval.as_secs_f64())
            )));
        }
        if self.failure.is_some() {
            spans.push("  refresh failed (below)".red().bold());
        }
        Line::from(spans)
    }

    fn footer(&self, hidden: usize) -> Line<'_> {
        let mut text = format!(
            "* = its operator's limit (semctl lock set)  start rate: set = the lock's own rate, \
             seen = starts seen in the last {} s",
            SEEN_WINDOW.as_secs()
        );
        if self.live.is_some() {
            text.push_str("  |  q quit  ↑↓ scroll");
        }
        let mut spans = vec![Span::raw(text).dark_gray()];
        if hidden > 0 || self.scroll > 0 {
            spans.insert(
                0,
                format!(
                    "{} lock(s) above, {hidden} below  ",
                    self.scroll.min(self.rows.len())
                )
                .yellow(),
            );
        }
        Line::from(spans)
    }

    /// Draws one lock's lines from `columns`' row; answers the next free row.
    fn draw_row(&self, row: &Row, columns: &Columns, body: Rect, buf: &mut Buffer) -> u16 {
        let y = columns.name.y;
        let lock = match row {
            Row::Unreadable { lock, error } => {
                Span::raw(tail(
                    lock.as_deref().unwrap_or("?"),
                    columns.name.width as usize,
                ))
                .render(columns.name, buf);
                let rest = Rect::new(
                    columns.bar.x,
                    y,
                    body.right().saturating_sub(columns.bar.x),
                    1,
                );
                Span::raw(format!("cannot be read: {error}"))
                    .red()
                    .render(rest, buf);
                return y + 1;
            }
            Row::Lock(lock) => lock,
        };
        Span::raw(tail(&lock.name, columns.name.width as usize))
            .bold()
            .render(columns.name, buf);
        let (ratio, limit) = match lock.limit {
            Some(limit) => (
                (lock.used as f64 / f64::from(limit.max(1))).min(1.0),
                limit.to_string(),
            ),
            None => (0.0, "-".to_owned()),
        };
        let colour = match lock.limit {
            Some(limit) if lock.used >= u64::from(limit) => Color::Red,
            Some(_) if ratio >= 0.8 => Color::Yellow,
            _ => Color::Green,
        };
        LineGauge::default()
            .ratio(ratio)
            .label(format!(
                "{:>9}",
                format!(
                    "{}/{limit}{}",
                    lock.used,
                    if lock.configured { "*" } else { "" }
                )
            ))
            .filled_symbol("█")
            .unfilled_symbol("░")
            .filled_style(Style::new().fg(colour))
            .unfilled_style(Style::new().fg(Color::DarkGray))
            .render(columns.bar, buf);
        let cells = [
            Span::raw(lock.holders.len().to_string()),
            Span::raw(lock.waiting.to_string()),
            match lock.oldest_wait_ms {
                Some(ms) => Span::raw(age(ms)).yellow(),
                None => Span::raw("-"),
            },
            Span::raw(lock.rate.to_string()),
        ];
        for (cell, rect) in cells.into_iter().zip(columns.rest) {
            cell.render(rect, buf);
        }

        let mut y = y + 1;
        let indent = 3u16;
        let width = body.width.saturating_sub(indent);
        for holder in lock.holders.iter().take(self.holders_shown) {
            let lease = holder
                .lease_left_ms
                .map_or(String::new(), |left| format!("  lease {}", age(left)));
            let facts = format!(
                "  weight {}  held {}{lease}",
                holder.weight,
                age(holder.held_ms)
            );
            let name_width = (width as usize).saturating_sub(facts.chars().count());
            Line::from(vec![
                Span::raw(tail(&holder.name, name_width)),
                Span::raw(facts).dark_gray(),
            ])
            .render(Rect::new(body.x + indent, y, width, 1), buf);
            y += 1;
        }
        let more = lock.holders.len().saturating_sub(self.holders_shown);
        if more > 0 {
            Span::raw(format!("… and {more} more holder(s)"))
                .dark_gray()
                .render(Rect::new(body.x + indent, y, width, 1), buf);
            y += 1;
        }
        if let Some(problem) = &lock.problem {
            Span::raw(problem.clone())
                .red()
                .render(Rect::new(body.x + indent, y, width, 1), buf);
            y += 1;
        }
        y
    }
}

/// A refresh interval as written: 1s, 0.5s.
fn humantime_secs(secs: f64) -> String {
    format!("{}s", (secs * 10.0).round() / 10.0)
}

/// The whole frame, `width` columns wide, as cells.
fn rendered(view: &View, width: u16) -> Buffer {
    let area = Rect::new(0, 0, width, view.height());
    let mut buf = Buffer::empty(area);
    view.render(area, &mut buf);
    buf
}

/// Each row of cells, up to its last one that shows something.
fn rows(buf: &Buffer) -> impl Iterator<Item = &[Cell]> {
    buf.content
        .chunks(usize::from(buf.area.width.max(1)))
        .map(|row| {
            let shown = row
                .iter()
                .rposition(|cell| cell.symbol() != " " || cell.style() != Style::default())
                .map_or(0, |last| last + 1);
            &row[..shown]
        })
}

/// The frame as plain text, `width` columns wide: one line per row of cells, trailing blanks cut,
/// no escape codes (what `--once` prints when stdout is not a terminal).
pub fn plain_text(view: &View, width: u16) -> String {
    let mut text = String::new();
    for row in rows(&rendered(view, width)) {
        let line: String = row.iter().map(Cell::symbol).collect();
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// The frame with its colours, for `--once` on a terminal: printed into the scrollback like any
/// command's output (no alternate screen, no raw mode), each run of one style set by crossterm.
pub fn write_styled(view: &View, width: u16, out: &mut impl std::io::Write) -> std::io::Result<()> {
    for row in rows(&rendered(view, width)) {
        for run in row.chunk_by(|a, b| a.style() == b.style()) {
            let text: String = run.iter().map(Cell::symbol).collect();
            let style = run[0].style().into_crossterm();
            queue!(out, PrintStyledContent(StyledContent::new(style, text)))?;
        }
        queue!(out, Print("\n"))?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use semaphore_core::{
        AcquisitionId, FencingToken, HolderId, Holding, Identity, SemaphoreItem, Weight,
    };

    use super::*;

    /// Lock `l` read at `at_ms` with a holder per (token, acquired at).
    fn reading(at_ms: u64, holders: &[(u64, u64)]) -> Reading {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        for (token, acquired_at_ms) in holders {
            item.holders.insert(
                Identity::new(
                    HolderId::new(format!("h{token}")).unwrap(),
                    AcquisitionId::new("a").unwrap(),
                ),
                Holding {
                    token: FencingToken(*token),
                    acquired_at_ms: *acquired_at_ms,
                    weight: Weight::ONE,
                },
            );
        }
        let read = LockRead {
            item,
            oldest_queued_at_ms: None,
            problem: None,
        };
        Reading {
            at_ms,
            entries: vec![Entry::Lock(Box::new(read))],
        }
    }

    #[test]
    fn seen_starts_count_every_acquisition_seen_until_it_started_a_window_ago() {
        let l = LockName::new("l").unwrap();
        let mut starts = Starts::default();
        starts.observe(&reading(100_000, &[(1, 95_000), (2, 99_000)]));
        assert_eq!(starts.per_second(&l), 0.2);
        // 1 and 2 were freed meanwhile: still counted, they started within the window.
        starts.observe(&reading(101_000, &[(3, 100_500)]));
        assert_eq!(starts.per_second(&l), 0.3);
        // A holder seen again is one acquisition, not two.
        starts.observe(&reading(102_000, &[(3, 100_500)]));
        assert_eq!(starts.per_second(&l), 0.3);
        // 1 started more than 10 s before this reading.
        starts.observe(&reading(105_500, &[]));
        assert_eq!(starts.per_second(&l), 0.2);
        starts.observe(&reading(120_000, &[]));
        assert_eq!(starts.per_second(&l), 0.0);
    }

    #[test]
    fn ages_read_as_a_person_says_them() {
        assert_eq!(age(999), "0s");
        assert_eq!(age(12_400), "12s");
        assert_eq!(age(245_000), "4m05s");
        assert_eq!(age(7_380_000), "2h03m");
        assert_eq!(age(3 * 86_400_000 + 4 * 3_600_000), "3d04h");
    }

    #[test]
    fn a_long_name_keeps_its_end() {
        assert_eq!(tail("short", 10), "short");
        assert_eq!(
            tail("arn:aws:states:eu-west-1:1:execution:m:run-7#default", 14),
            "…run-7#default"
        );
        assert_eq!(tail("abc", 0), "");
    }
}
