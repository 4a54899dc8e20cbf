//! A distribution: the empirical CDF of one or more sample sets (e.g. wait times and hand-off
//! latency), each a step line from 0 to 1, with its count, p50 and p99 in the legend. A CDF
//! rather than a histogram: several sets share one picture without bins to choose, and the
//! tail (what a p99 is) stays visible.

use plotters::prelude::*;

use crate::{check_finite, colour, draw_svg, titled, ChartError, Header, Svg, FONT};

const WIDTH: u32 = 900;
const HEIGHT: u32 = 340;
const HEADER: Header = Header {
    height: 64,
    legend_y: 44,
    char_width: 7,
};

#[derive(Debug, Clone)]
pub struct Distribution {
    pub title: String,
    /// The values' description, with their unit (e.g. "milliseconds").
    pub value_label: String,
    pub sets: Vec<SampleSet>,
}

#[derive(Debug, Clone)]
pub struct SampleSet {
    pub label: String,
    pub values: Vec<f64>,
}

impl SampleSet {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The nearest-rank percentile (`p` in 0..=100), None for an empty set.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        let v = self.sorted();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v.get(rank.clamp(1, v.len().max(1)) - 1).copied()
    }

    /// The CDF's path: at each value the fraction of samples at or below it steps up.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let v = self.sorted();
        let n = v.len() as f64;
        let mut path = Vec::with_capacity(v.len() * 2);
        for (i, &x) in v.iter().enumerate() {
            path.push((x, i as f64 / n));
            path.push((x, (i + 1) as f64 / n));
        }
        path
    }

    /// The legend entry: the label, the count, p50 and p99.
    pub fn legend(&self) -> String {
        match (self.percentile(50.0), self.percentile(99.0)) {
            (Some(p50), Some(p99)) => format!(
                "{}: n {}, p50 {}, p99 {}",
                self.label,
                self.values.len(),
                short(p50),
                short(p99)
            ),
            _ => format!("{}: no samples", self.label),
        }
    }
}

/// Three significant digits, without trailing noise.
fn short(x: f64) -> String {
    let digits = if x.abs() >= 100.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{x:.digits$}")
}

impl Distribution {
    fn check(&self) -> Result<(), ChartError> {
        if self.sets.iter().all(|s| s.values.is_empty()) {
            return Err(ChartError::Empty {
                chart: self.title.clone(),
                what: "no sample in any set".into(),
            });
        }
        for s in &self.sets {
            for &v in &s.values {
                check_finite(&self.title, &format!("a sample of {}", s.label), v)?;
            }
        }
        Ok(())
    }

    pub fn svg(&self) -> Result<Svg, ChartError> {
        self.check()?;
        let all = self.sets.iter().flat_map(|s| s.values.iter().copied());
        let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        let lo = lo.min(0.0);
        let hi = if hi > lo { hi * 1.02 } else { lo + 1.0 };
        draw_svg(&self.title, (WIDTH, HEIGHT), |root| {
            let legends: Vec<String> = self.sets.iter().map(SampleSet::legend).collect();
            let body = titled(
                root,
                &HEADER,
                &self.title,
                legends.iter().map(String::as_str),
            )?;
            let mut chart = ChartBuilder::on(&body)
                .margin(8)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(lo..hi, 0f64..1.0)?;
            chart
                .configure_mesh()
                .x_desc(self.value_label.as_str())
                .y_desc("fraction at or below")
                .y_labels(6)
                .light_line_style(TRANSPARENT)
                .label_style((FONT, 11))
                .axis_desc_style((FONT, 12))
                .draw()?;
            for (i, set) in self.sets.iter().enumerate() {
                if !set.values.is_empty() {
                    chart.draw_series(std::iter::once(PathElement::new(
                        set.cdf(),
                        colour(i).stroke_width(2),
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

    fn waits() -> Distribution {
        Distribution {
            title: "waits".into(),
            value_label: "milliseconds".into(),
            sets: vec![
                SampleSet {
                    label: "wait".into(),
                    values: vec![30.0, 10.0, 20.0, 40.0],
                },
                SampleSet {
                    label: "hand-off".into(),
                    values: vec![5.0, 7.0],
                },
                SampleSet {
                    label: "expired".into(),
                    values: vec![],
                },
            ],
        }
    }

    #[test]
    fn the_cdf_steps_up_by_one_sample_at_each_value_in_order() {
        let set = &waits().sets[0];
        assert_eq!(
            set.cdf(),
            vec![
                (10.0, 0.0),
                (10.0, 0.25),
                (20.0, 0.25),
                (20.0, 0.5),
                (30.0, 0.5),
                (30.0, 0.75),
                (40.0, 0.75),
                (40.0, 1.0)
            ]
        );
        assert_eq!(set.percentile(50.0), Some(20.0));
        assert_eq!(set.percentile(99.0), Some(40.0));
        assert_eq!(set.percentile(0.0), Some(10.0));
        assert_eq!(waits().sets[2].percentile(50.0), None);
    }

    #[test]
    fn each_set_is_one_rising_line_from_0_to_1_with_its_figures_in_the_legend() {
        let d = waits();
        let svg = d.svg().unwrap().into_string();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        for (i, points) in [(0, 8), (1, 4)] {
            let lines: Vec<_> = doc
                .descendants()
                .filter(|n| {
                    n.has_tag_name("polyline")
                        && n.attribute("stroke") == Some(hex(colour(i)).as_str())
                })
                .collect();
            assert_eq!(lines.len(), 1, "set {i}");
            let ys: Vec<f64> = lines[0]
                .attribute("points")
                .unwrap()
                .split_whitespace()
                .map(|p| p.split_once(',').unwrap().1.parse().unwrap())
                .collect();
            assert_eq!(ys.len(), points);
            // Rising in the picture: SVG y never grows along the line.
            assert!(ys.windows(2).all(|w| w[1] <= w[0]), "set {i}: {ys:?}");
        }
        let texts = crate::svg_texts(&svg);
        for label in [
            "waits",
            "wait: n 4, p50 20.0, p99 40.0",
            "hand-off: n 2, p50 5.00, p99 7.00",
            "expired: no samples",
            "milliseconds",
            "fraction at or below",
        ] {
            assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
        }
    }

    #[test]
    fn bad_input_is_a_named_error() {
        let mut d = waits();
        d.sets[1].values.push(f64::NAN);
        assert!(matches!(d.svg(), Err(ChartError::NotFinite { .. })));
        d.sets.iter_mut().for_each(|s| s.values.clear());
        assert!(matches!(d.svg(), Err(ChartError::Empty { .. })));
    }
}
