//! Charts as SVG text, and an HTML page that carries them inline: what the bench draws into
//! BENCHMARKS.md and the local run into its report, in one place.
//!
//! - [`bars`]: one bar per row of a table, in panels (one per measured column), coloured by
//!   series (ours, the AWS sample) with each bar's value written above it.
//! - [`timeline`]: values over time in stacked panels sharing the time axis (step lines, e.g. a
//!   lock's weight in use and its line; straight lines, e.g. the limit), with event markers
//!   (failures, stops, cleanups, sweeps) across every panel.
//! - [`distribution`]: the empirical CDF of one or more sample sets (wait times, hand-off
//!   latency), with their count, p50 and p99 in the legend.
//! - [`page`]: a self-contained HTML page (title, sections, inline SVGs, small tables; no
//!   script, no external resource).
//! - [`browser`]: a test helper: such a page checked in headless Chromium (loads without
//!   errors, lays out and paints every chart).
//!
//! Drawn with plotters' SVG backend. Every input is checked first: a chart of nothing, or with a
//! value that is not finite, is a named [`ChartError`], never a panic or an empty picture.

pub mod bars;
pub mod browser;
pub mod distribution;
pub mod page;
pub mod timeline;

pub use bars::{Bar, BarChart, BarPanel};
pub use distribution::{Distribution, SampleSet};
pub use page::{Block, Page, Section, Table};
pub use timeline::{Line, LineShape, Marker, Timeline, TimelinePanel};

use plotters::style::RGBColor;

/// An SVG document drawn by this crate (so safe to inline in a [`Page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Svg(String);

impl Svg {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("chart {chart:?}: nothing to draw ({what})")]
    Empty { chart: String, what: String },
    #[error("chart {chart:?}: {what} is not a finite number ({value})")]
    NotFinite {
        chart: String,
        what: String,
        value: f64,
    },
    #[error("chart {chart:?}: {what}")]
    Invalid { chart: String, what: String },
    #[error("chart {chart:?}: drawing failed: {message}")]
    Draw { chart: String, message: String },
}

/// Series colours, in order: the first is ours, the second the reference (the AWS sample); the
/// rest for more lines or marker kinds. Chosen apart from the grid's greys so that a bar or a
/// line is told from the mesh by its colour alone (the tests rely on it).
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4), // blue
    RGBColor(0xff, 0x7f, 0x0e), // orange
    RGBColor(0x2c, 0xa0, 0x2c), // green
    RGBColor(0xd6, 0x27, 0x28), // red
    RGBColor(0x94, 0x67, 0xbd), // purple
    RGBColor(0x8c, 0x56, 0x4b), // brown
    RGBColor(0xe3, 0x77, 0xc2), // pink
    RGBColor(0x17, 0xbe, 0xcf), // cyan
];

/// The colour of the `index`-th series (cycling through [`PALETTE`]).
pub fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// `#rrggbb`, as plotters writes a colour into the SVG.
pub fn hex(colour: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", colour.0, colour.1, colour.2)
}

const FONT: &str = "sans-serif";

fn check_finite(chart: &str, what: &str, value: f64) -> Result<(), ChartError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(ChartError::NotFinite {
            chart: chart.to_owned(),
            what: what.to_owned(),
            value,
        })
    }
}

/// Draws into an SVG string of the given size; plotters' errors become [`ChartError::Draw`].
/// The drawing area of an SVG being drawn.
type SvgArea<'a> =
    plotters::drawing::DrawingArea<plotters::backend::SVGBackend<'a>, plotters::coord::Shift>;

/// How a chart kind lays out its header: its height, the legend's row (the dots' centre; each
/// label sits 7 px above it, beside its dot) and the width a label's character is given.
struct Header {
    height: u32,
    legend_y: i32,
    char_width: i32,
}

/// Every chart's top: a white page, the title, and a legend row with one dot per label in
/// `colour(i)`. Returns the area below it, for the chart itself.
fn titled<'a, 'l>(
    root: SvgArea<'a>,
    header: &Header,
    title: &str,
    legend: impl IntoIterator<Item = &'l str>,
) -> Result<SvgArea<'a>, Box<dyn std::error::Error + 'a>> {
    use plotters::prelude::*;
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(header.height);
    head.draw(&Text::new(
        title.to_owned(),
        (12, 8),
        (FONT, 18).into_font().color(&BLACK),
    ))?;
    let mut x = 14;
    for (i, label) in legend.into_iter().enumerate() {
        head.draw(&Circle::new((x, header.legend_y), 5, colour(i).filled()))?;
        head.draw(&Text::new(
            label.to_owned(),
            (x + 10, header.legend_y - 7),
            (FONT, 13).into_font().color(&BLACK),
        ))?;
        x += 40 + header.char_width * label.chars().count() as i32;
    }
    Ok(body)
}

fn draw_svg<F>(chart: &str, size: (u32, u32), draw: F) -> Result<Svg, ChartError>
where
    F: FnOnce(
        plotters::drawing::DrawingArea<plotters::backend::SVGBackend<'_>, plotters::coord::Shift>,
    ) -> Result<(), Box<dyn std::error::Error + '_>>,
{
    let mut text = String::new();
    {
        let root = plotters::drawing::IntoDrawingArea::into_drawing_area(
            plotters::backend::SVGBackend::with_string(&mut text, size),
        );
        let failed = draw(root).err().map(|e| e.to_string());
        if let Some(message) = failed {
            return Err(ChartError::Draw {
                chart: chart.to_owned(),
                message,
            });
        }
    }
    Ok(Svg(text))
}

/// The text of every `<text>` element of an SVG, in document order.
#[cfg(test)]
fn svg_texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG parses as XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect()
}
