//! Values over time: stacked panels sharing one time axis (e.g. a lock's weight in use as a
//! step line against its limit, then the line's length), with event markers (failures, stops,
//! cleanups, sweeps) drawn as vertical lines across every panel.

use plotters::prelude::*;

use crate::{check_finite, colour, draw_svg, titled, ChartError, Header, Svg, FONT};

const WIDTH: u32 = 900;
const PANEL_HEIGHT: u32 = 210;
const HEADER: Header = Header {
    height: 64,
    legend_y: 44,
    char_width: 8,
};

#[derive(Debug, Clone)]
pub struct Timeline {
    pub title: String,
    /// The time axis' description, with its unit (e.g. "seconds since the run started").
    pub time_label: String,
    pub panels: Vec<TimelinePanel>,
    pub markers: Vec<Marker>,
}

#[derive(Debug, Clone)]
pub struct TimelinePanel {
    pub y_label: String,
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone)]
pub struct Line {
    pub label: String,
    pub shape: LineShape,
    /// (time, value), in time order.
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineShape {
    /// The value holds until the next point (a count sampled when it changes).
    Step,
    /// Straight from point to point.
    Straight,
}

/// An event at a time; markers of one `kind` share a colour and a legend entry.
#[derive(Debug, Clone)]
pub struct Marker {
    pub at: f64,
    pub kind: String,
}

impl Line {
    /// The points the polyline goes through: a step line holds each value until the next time.
    pub fn path(&self) -> Vec<(f64, f64)> {
        match self.shape {
            LineShape::Straight => self.points.clone(),
            LineShape::Step => {
                let mut path = Vec::with_capacity(self.points.len() * 2);
                for (i, &(t, v)) in self.points.iter().enumerate() {
                    if i > 0 {
                        path.push((t, self.points[i - 1].1));
                    }
                    path.push((t, v));
                }
                path
            }
        }
    }
}

impl Timeline {
    /// The marker kinds in order of first appearance; kind k is coloured after the lines.
    pub fn marker_kinds(&self) -> Vec<&str> {
        let mut kinds: Vec<&str> = Vec::new();
        for m in &self.markers {
            if !kinds.contains(&m.kind.as_str()) {
                kinds.push(&m.kind);
            }
        }
        kinds
    }

    fn lines(&self) -> impl Iterator<Item = &Line> {
        self.panels.iter().flat_map(|p| &p.lines)
    }

    fn check(&self) -> Result<(), ChartError> {
        if self.panels.is_empty() || self.lines().all(|l| l.points.is_empty()) {
            return Err(ChartError::Empty {
                chart: self.title.clone(),
                what: "no line with a point".into(),
            });
        }
        for line in self.lines() {
            let mut last = f64::NEG_INFINITY;
            for &(t, v) in &line.points {
                check_finite(&self.title, &format!("a time of {}", line.label), t)?;
                check_finite(&self.title, &format!("a value of {}", line.label), v)?;
                if t < last {
                    return Err(ChartError::Invalid {
                        chart: self.title.clone(),
                        what: format!("{}: time {t} after {last}: points out of order", line.label),
                    });
                }
                last = t;
            }
        }
        for m in &self.markers {
            check_finite(&self.title, &format!("the time of a {}", m.kind), m.at)?;
        }
        Ok(())
    }

    pub fn svg(&self) -> Result<Svg, ChartError> {
        self.check()?;
        let times = self
            .lines()
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .chain(self.markers.iter().map(|m| m.at));
        let (start, end) = times.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| {
            (lo.min(t), hi.max(t))
        });
        let end = if end > start { end } else { start + 1.0 };
        let kinds = self.marker_kinds();
        let line_count = self.lines().count();
        let height = HEADER.height + PANEL_HEIGHT * self.panels.len() as u32;
        draw_svg(&self.title, (WIDTH, height), |root| {
            let legend = self
                .lines()
                .map(|l| l.label.as_str())
                .chain(kinds.iter().copied());
            let body = titled(root, &HEADER, &self.title, legend)?;
            let areas = body.split_evenly((self.panels.len(), 1));
            let mut line_index = 0;
            for (p, (panel, area)) in self.panels.iter().zip(&areas).enumerate() {
                let max = panel
                    .lines
                    .iter()
                    .flat_map(|l| l.points.iter().map(|p| p.1))
                    .fold(0.0, f64::max);
                let top = if max > 0.0 { max * 1.1 } else { 1.0 };
                let last = p + 1 == self.panels.len();
                let mut chart = ChartBuilder::on(area)
                    .margin(8)
                    .x_label_area_size(if last { 36 } else { 16 })
                    .y_label_area_size(56)
                    .build_cartesian_2d(start..end, 0f64..top)?;
                let mut mesh = chart.configure_mesh();
                mesh.y_desc(panel.y_label.as_str())
                    .y_labels(5)
                    .light_line_style(TRANSPARENT)
                    .label_style((FONT, 11))
                    .axis_desc_style((FONT, 12));
                if last {
                    mesh.x_desc(self.time_label.as_str());
                }
                mesh.draw()?;
                for line in &panel.lines {
                    chart.draw_series(std::iter::once(PathElement::new(
                        line.path(),
                        colour(line_index).stroke_width(2),
                    )))?;
                    line_index += 1;
                }
                for m in &self.markers {
                    let k = kinds.iter().position(|k| *k == m.kind).unwrap_or(0);
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(m.at, 0.0), (m.at, top)],
                        colour(line_count + k).stroke_width(2),
                    )))?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;

    fn lock() -> Timeline {
        Timeline {
            title: "lock jobs".into(),
            time_label: "seconds since the run started".into(),
            panels: vec![
                TimelinePanel {
                    y_label: "weight".into(),
                    lines: vec![
                        Line {
                            label: "in use".into(),
                            shape: LineShape::Step,
                            points: vec![(0.0, 0.0), (1.0, 3.0), (2.5, 5.0), (4.0, 2.0)],
                        },
                        Line {
                            label: "limit".into(),
                            shape: LineShape::Straight,
                            points: vec![(0.0, 5.0), (4.0, 5.0)],
                        },
                    ],
                },
                TimelinePanel {
                    y_label: "waiting".into(),
                    lines: vec![Line {
                        label: "in line".into(),
                        shape: LineShape::Step,
                        points: vec![(0.0, 0.0), (2.0, 4.0), (3.0, 1.0), (4.0, 0.0)],
                    }],
                },
            ],
            markers: vec![
                Marker {
                    at: 1.5,
                    kind: "failure".into(),
                },
                Marker {
                    at: 3.2,
                    kind: "cleanup".into(),
                },
                Marker {
                    at: 3.5,
                    kind: "failure".into(),
                },
            ],
        }
    }

    /// The polylines of one colour: their points, parsed.
    fn polylines(svg: &str, colour_hex: &str) -> Vec<Vec<(f64, f64)>> {
        let doc = roxmltree::Document::parse(svg).expect("the SVG parses as XML");
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(colour_hex))
            .map(|n| {
                n.attribute("points")
                    .unwrap()
                    .split_whitespace()
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn step_lines_hold_each_value_until_the_next_time() {
        let line = &lock().panels[0].lines[0];
        assert_eq!(
            line.path(),
            vec![
                (0.0, 0.0),
                (1.0, 0.0),
                (1.0, 3.0),
                (2.5, 3.0),
                (2.5, 5.0),
                (4.0, 5.0),
                (4.0, 2.0)
            ]
        );
    }

    #[test]
    fn each_line_is_drawn_once_in_its_colour_and_each_marker_across_every_panel() {
        let timeline = lock();
        let svg = timeline.svg().unwrap().into_string();
        // Lines: in use (step, 7 points), limit (2), in line (step, 7), one polyline each.
        for (i, points) in [7, 2, 7].into_iter().enumerate() {
            let lines = polylines(&svg, &hex(colour(i)));
            assert_eq!(lines.len(), 1, "line {i}");
            assert_eq!(lines[0].len(), points, "line {i}: {:?}", lines[0]);
        }
        // The in-use step line rises where the value does: y falls (SVG y grows downwards).
        let in_use = &polylines(&svg, &hex(colour(0)))[0];
        assert_eq!(in_use[1].1, in_use[0].1, "flat until the first change");
        assert!(in_use[2].1 < in_use[1].1 && in_use[4].1 < in_use[3].1);
        assert!(in_use[6].1 > in_use[5].1, "falls at the end");
        // Markers: kinds coloured after the 3 lines; 2 failures and 1 cleanup, in 2 panels, each
        // a vertical line.
        let failures = polylines(&svg, &hex(colour(3)));
        let cleanups = polylines(&svg, &hex(colour(4)));
        assert_eq!((failures.len(), cleanups.len()), (4, 2));
        for m in failures.iter().chain(&cleanups) {
            assert_eq!(m.len(), 2);
            assert_eq!(m[0].0, m[1].0, "vertical: {m:?}");
        }
        // In time order along x: the failure at 1.5 s left of the cleanup at 3.2 s.
        assert!(failures[0][0].0 < cleanups[0][0].0 && cleanups[0][0].0 < failures[1][0].0);
        let texts = crate::svg_texts(&svg);
        for label in [
            "lock jobs",
            "in use",
            "limit",
            "in line",
            "failure",
            "cleanup",
            "weight",
            "waiting",
            "seconds since the run started",
        ] {
            assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
        }
    }

    #[test]
    fn bad_input_is_a_named_error() {
        let mut t = lock();
        t.panels[0].lines[0].points.swap(1, 2);
        let err = t.svg().unwrap_err();
        assert!(err.to_string().contains("out of order"), "{err}");
        let mut t = lock();
        t.markers[0].at = f64::INFINITY;
        assert!(matches!(t.svg(), Err(ChartError::NotFinite { .. })));
        let mut t = lock();
        for p in &mut t.panels {
            for l in &mut p.lines {
                l.points.clear();
            }
        }
        assert!(matches!(t.svg(), Err(ChartError::Empty { .. })));
    }
}
