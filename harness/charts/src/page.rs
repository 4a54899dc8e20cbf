//! A self-contained HTML page: a title, sections of text, inline SVG charts and small tables of
//! numbers. No script, no stylesheet or font to fetch, no image file: the page is one file that
//! opens anywhere, offline, as it was written.

use crate::{ChartError, Svg};

#[derive(Debug, Clone)]
pub struct Page {
    pub title: String,
    pub sections: Vec<Section>,
}

#[derive(Debug, Clone)]
pub struct Section {
    pub heading: String,
    pub blocks: Vec<Block>,
}

#[derive(Debug, Clone)]
pub enum Block {
    /// A paragraph of plain text (escaped).
    Text(String),
    Chart(Svg),
    Table(Table),
}

#[derive(Debug, Clone)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:960px;color:#222}\
figure{margin:1em 0}svg{max-width:100%;height:auto}\
table{border-collapse:collapse;margin:1em 0}\
th,td{border:1px solid #bbb;padding:.25em .6em;text-align:right}\
th:first-child,td:first-child{text-align:left}";

/// Text as HTML character data or an attribute value: the five characters HTML gives a meaning.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

impl Page {
    /// The number of charts on the page (what a browser must draw).
    pub fn charts(&self) -> usize {
        self.sections
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| matches!(b, Block::Chart(_)))
            .count()
    }

    pub fn html(&self) -> Result<String, ChartError> {
        let mut out = String::new();
        out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
        out.push_str(&format!(
            "<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
            escape(&self.title),
            escape(&self.title)
        ));
        for section in &self.sections {
            out.push_str(&format!(
                "<section>\n<h2>{}</h2>\n",
                escape(&section.heading)
            ));
            for block in &section.blocks {
                match block {
                    Block::Text(text) => out.push_str(&format!("<p>{}</p>\n", escape(text))),
                    Block::Chart(svg) => {
                        out.push_str(&format!("<figure>\n{}\n</figure>\n", svg.as_str()))
                    }
                    Block::Table(table) => self.table(&mut out, &section.heading, table)?,
                }
            }
            out.push_str("</section>\n");
        }
        out.push_str("</body>\n</html>\n");
        Ok(out)
    }

    fn table(&self, out: &mut String, section: &str, table: &Table) -> Result<(), ChartError> {
        if let Some(row) = table.rows.iter().find(|r| r.len() != table.header.len()) {
            return Err(ChartError::Invalid {
                chart: format!("{} / {section}", self.title),
                what: format!(
                    "a table row of {} cells under a header of {}: {row:?}",
                    row.len(),
                    table.header.len()
                ),
            });
        }
        out.push_str("<table>\n<tr>");
        for h in &table.header {
            out.push_str(&format!("<th>{}</th>", escape(h)));
        }
        out.push_str("</tr>\n");
        for row in &table.rows {
            out.push_str("<tr>");
            for cell in row {
                out.push_str(&format!("<td>{}</td>", escape(cell)));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Distribution, SampleSet};

    fn page() -> Page {
        let chart = Distribution {
            title: "waits".into(),
            value_label: "ms".into(),
            sets: vec![SampleSet {
                label: "wait".into(),
                values: vec![1.0, 2.0],
            }],
        }
        .svg()
        .unwrap();
        Page {
            title: "Local run <2026-12-04> & chaos".into(),
            sections: vec![
                Section {
                    heading: "Lock \"jobs\"".into(),
                    blocks: vec![
                        Block::Text("p < 1 & q > 2".into()),
                        Block::Chart(chart.clone()),
                        Block::Table(Table {
                            header: vec!["figure".into(), "value".into()],
                            rows: vec![
                                vec!["<script>alert(1)</script>".into(), "3".into()],
                                vec!["waits".into(), "5".into()],
                            ],
                        }),
                    ],
                },
                Section {
                    heading: "Waits".into(),
                    blocks: vec![Block::Chart(chart)],
                },
            ],
        }
    }

    #[test]
    fn the_page_carries_its_charts_inline_and_escapes_every_text() {
        let page = page();
        let html = page.html().unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<title>Local run &lt;2026-12-04&gt; &amp; chaos</title>"));
        assert!(html.contains("<h2>Lock &quot;jobs&quot;</h2>"));
        assert!(html.contains("<p>p &lt; 1 &amp; q &gt; 2</p>"));
        assert!(html.contains("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>3</td>"));
        assert_eq!(page.charts(), 2);
        assert_eq!(html.matches("<svg").count(), 2);
        assert_eq!(html.matches("<section>").count(), 2);
        assert_eq!(html.matches("<tr>").count(), 3);
        // Self-contained: nothing to fetch, nothing to run.
        for outside in ["<script", "src=", "href=", "url(", "@import", "<link"] {
            assert!(!html.contains(outside), "{outside}");
        }
    }

    #[test]
    fn a_ragged_table_is_a_named_error() {
        let mut page = page();
        if let Block::Table(t) = &mut page.sections[0].blocks[2] {
            t.rows[1].push("extra".into());
        }
        let err = page.html().unwrap_err();
        assert!(
            err.to_string().contains("3 cells under a header of 2"),
            "{err}"
        );
    }
}
