//! Bars: one per row of a table, in panels side by side (one per measured column), grouped
//! (e.g. by contenders) and coloured by series (ours, the AWS sample), each with its value
//! written above it.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::{check_finite, colour, draw_svg, titled, ChartError, Header, Svg, FONT};

/// A panel's width: this much per group of bars, and at least `PANEL_WIDTH`.
const PANEL_WIDTH: u32 = 300;
const GROUP_WIDTH: u32 = 100;
const HEIGHT: u32 = 360;
const HEADER: Header = Header {
    height: 56,
    legend_y: 40,
    char_width: 7,
};

/// A chart of bars in panels side by side, sharing one legend of series.
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    /// The series' names, in colour order ([`crate::colour`]): a bar's `series` indexes it.
    pub series: Vec<String>,
    pub panels: Vec<BarPanel>,
}

/// One measured column: its bars in the table's row order.
#[derive(Debug, Clone)]
pub struct BarPanel {
    /// The column, with its unit (e.g. "acquire p99, ms").
    pub title: String,
    /// Digits after the point in the value written above each bar.
    pub decimals: usize,
    /// Consecutive bars with the same `group` stand together under its label.
    pub bars: Vec<Bar>,
}

#[derive(Debug, Clone)]
pub struct Bar {
    pub group: String,
    pub series: usize,
    pub value: f64,
}

impl BarPanel {
    /// The groups in order, each with its bars (consecutive bars of one label).
    fn groups(&self) -> Vec<(&str, Vec<&Bar>)> {
        let mut groups: Vec<(&str, Vec<&Bar>)> = Vec::new();
        for bar in &self.bars {
            match groups.last_mut() {
                Some((label, bars)) if *label == bar.group => bars.push(bar),
                _ => groups.push((&bar.group, vec![bar])),
            }
        }
        groups
    }

    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        DB::ErrorType: 'static,
    {
        let groups = self.groups();
        let max = self.bars.iter().map(|b| b.value).fold(0.0, f64::max);
        // Room above the tallest bar for its value.
        let top = if max > 0.0 { max * 1.18 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FONT, 15))
            .margin(8)
            .x_label_area_size(26)
            .y_label_area_size(46)
            .build_cartesian_2d(0f64..groups.len() as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(6)
            .y_label_style((FONT, 11))
            .light_line_style(TRANSPARENT)
            .draw()?;
        let value_style = TextStyle::from((FONT, 11).into_font())
            .pos(Pos::new(HPos::Center, VPos::Bottom))
            .color(&BLACK);
        let label_style = TextStyle::from((FONT, 12).into_font())
            .pos(Pos::new(HPos::Center, VPos::Top))
            .color(&BLACK);
        for (g, (label, bars)) in groups.iter().enumerate() {
            let width = 0.8 / bars.len() as f64;
            for (j, bar) in bars.iter().enumerate() {
                let x0 = g as f64 + 0.1 + j as f64 * width;
                let x1 = x0 + width * 0.9;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x1, bar.value)],
                    colour(bar.series).filled(),
                )))?;
                chart.draw_series(std::iter::once(Text::new(
                    format!("{:.*}", self.decimals, bar.value),
                    ((x0 + x1) / 2.0, bar.value),
                    value_style.clone(),
                )))?;
            }
            // Under the axis, in the label area (outside the plot's coordinates).
            let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
            let (x0, y0) = area.get_base_pixel();
            area.draw(&Text::new(
                label.to_string(),
                (x - x0, y - y0 + 6),
                label_style.clone(),
            ))?;
        }
        Ok(())
    }
}

impl BarChart {
    fn check(&self) -> Result<(), ChartError> {
        let invalid = |what: String| ChartError::Invalid {
            chart: self.title.clone(),
            what,
        };
        if self.panels.is_empty() {
            return Err(ChartError::Empty {
                chart: self.title.clone(),
                what: "no panel".into(),
            });
        }
        for panel in &self.panels {
            if panel.bars.is_empty() {
                return Err(ChartError::Empty {
                    chart: self.title.clone(),
                    what: format!("panel {:?} has no bar", panel.title),
                });
            }
            for bar in &panel.bars {
                let what = format!("{} / {}", panel.title, bar.group);
                check_finite(&self.title, &what, bar.value)?;
                if bar.value < 0.0 {
                    return Err(invalid(format!("{what}: negative bar {}", bar.value)));
                }
                if bar.series >= self.series.len() {
                    return Err(invalid(format!(
                        "{what}: series {} of {}",
                        bar.series,
                        self.series.len()
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn svg(&self) -> Result<Svg, ChartError> {
        self.check()?;
        let groups = self.panels.iter().map(|p| p.groups().len()).max();
        let panel_width = PANEL_WIDTH.max(GROUP_WIDTH * groups.unwrap_or(0) as u32);
        let width = 20 + panel_width * self.panels.len() as u32;
        draw_svg(&self.title, (width, HEIGHT), |root| {
            let body = titled(
                root,
                &HEADER,
                &self.title,
                self.series.iter().map(String::as_str),
            )?;
            let areas = body.split_evenly((1, self.panels.len()));
            for (panel, area) in self.panels.iter().zip(&areas) {
                panel.draw(area)?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    fn chart(values: &[f64]) -> BarChart {
        let bars = |scale: f64| {
            values
                .iter()
                .enumerate()
                .map(|(i, v)| Bar {
                    group: format!("C={}", [1, 8, 50][i / 2]),
                    series: i % 2,
                    value: v * scale,
                })
                .collect()
        };
        BarChart {
            title: "Deployment-shaped".into(),
            series: vec!["ours".into(), "AWS sample".into()],
            panels: vec![
                BarPanel {
                    title: "CS/s".into(),
                    decimals: 1,
                    bars: bars(1.0),
                },
                BarPanel {
                    title: "acquire p99, ms".into(),
                    decimals: 1,
                    bars: bars(10.0),
                },
            ],
        }
    }

    /// Per series colour, the heights of its bars in document order.
    fn bar_heights(svg: &str, colour_hex: &str) -> Vec<f64> {
        let doc = roxmltree::Document::parse(svg).expect("the SVG parses as XML");
        doc.descendants()
            .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(colour_hex))
            .map(|n| n.attribute("height").unwrap().parse::<f64>().unwrap())
            .collect()
    }

    #[test]
    fn one_bar_per_row_in_each_panel_coloured_by_series_and_as_tall_as_its_value() {
        let values = [1.9, 1.9, 6.9, 6.2, 7.2, 6.6];
        let svg = chart(&values).svg().unwrap().into_string();
        for series in 0..2 {
            let heights = bar_heights(&svg, &hex(colour(series)));
            let want: Vec<f64> = values.iter().skip(series).step_by(2).copied().collect();
            // Two panels, the rows in table order in each.
            assert_eq!(
                heights.len(),
                2 * want.len(),
                "series {series}: {heights:?}"
            );
            for (panel, heights) in heights.chunks(want.len()).enumerate() {
                let tallest = heights.iter().copied().fold(0.0, f64::max);
                let scale = tallest / want.iter().copied().fold(0.0, f64::max);
                for (h, v) in heights.iter().zip(&want) {
                    // Proportional, within plotters' rounding to whole pixels at both ends.
                    assert!(
                        (h - v * scale).abs() <= 2.0,
                        "series {series} panel {panel}: {heights:?} against {want:?}"
                    );
                }
            }
        }
        let texts = crate::svg_texts(&svg);
        for label in [
            "Deployment-shaped",
            "ours",
            "AWS sample",
            "CS/s",
            "acquire p99, ms",
            "C=1",
            "C=8",
            "C=50",
        ] {
            assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
        }
        // Each bar's value above it, in row order, in each panel: the centred numbers (the
        // axis' numbers stand right-aligned beside it).
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let shown: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text") && n.attribute("text-anchor") == Some("middle"))
            .filter_map(|n| n.text().map(str::trim))
            .filter(|t| t.parse::<f64>().is_ok())
            .collect();
        let want: Vec<String> = values
            .iter()
            .map(|v| format!("{v:.1}"))
            .chain(values.iter().map(|v| format!("{:.1}", v * 10.0)))
            .collect();
        assert_eq!(shown, want);
    }

    #[test]
    fn bad_input_is_a_named_error() {
        let mut nan = chart(&[1.0, f64::NAN, 1.0, 1.0, 1.0, 1.0]);
        assert!(matches!(nan.svg(), Err(ChartError::NotFinite { .. })));
        nan.panels.clear();
        assert!(matches!(nan.svg(), Err(ChartError::Empty { .. })));
        let mut negative = chart(&[1.0, -1.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(matches!(negative.svg(), Err(ChartError::Invalid { .. })));
        negative.panels[0].bars[1].value = 1.0;
        negative.panels[1].bars[1].value = 1.0;
        negative.series.pop();
        let err = negative.svg().unwrap_err();
        assert!(err.to_string().contains("series 1 of 1"), "{err}");
        let mut empty = chart(&[1.0; 6]);
        empty.panels[1].bars.clear();
        assert!(matches!(empty.svg(), Err(ChartError::Empty { .. })));
    }
}
