//! A test helper: a page written by this crate, checked in a real browser. Headless Chromium
//! (Debian's package) loads it, must load it without an error or a request for anything
//! outside the page, lay out every chart with every shape and text drawn (a non-empty box), and
//! paint them (the first two series' colours are on a screenshot). Used by this crate's browser
//! test and by the local run's, on the report it wrote.
//!
//! The page under test is left as written: the probe (a script recording errors, then at `load`
//! what was laid out) goes into a copy in a scratch directory, with the browser's profile.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::colour;

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error(
        "no Chromium at {0} (apt-get install -y chromium, or set CHROMIUM=path); CI must have it"
    )]
    Missing(String),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("chromium did not finish in {0:?}: {1}")]
    Timeout(Duration, String),
    #[error("the probe did not run in {page}: status {status}, stderr {stderr}")]
    NoProbe {
        page: String,
        status: String,
        stderr: String,
    },
    #[error("the probe's JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the screenshot: {0}")]
    Png(String),
    #[error("{page}: {what}")]
    Failed { page: String, what: String },
}

/// `CHROMIUM` if set (only it), else Debian's. None when it is not there, except in CI (`CI`
/// set), where .ci/run installs it and its absence is an error.
pub fn chromium() -> Result<Option<PathBuf>, BrowserError> {
    let candidates = match std::env::var_os("CHROMIUM") {
        Some(path) => vec![PathBuf::from(path)],
        None => ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .map(PathBuf::from)
            .to_vec(),
    };
    match candidates.iter().find(|p| p.is_file()) {
        Some(found) => Ok(Some(found.clone())),
        None if std::env::var_os("CI").is_some() => {
            Err(BrowserError::Missing(format!("{candidates:?}")))
        }
        None => Ok(None),
    }
}

/// What the browser laid out of one SVG.
#[derive(Debug, Clone, PartialEq)]
pub struct SvgProbe {
    pub width: f64,
    pub height: f64,
    pub shapes: u64,
    pub shapes_drawn: u64,
    pub texts: u64,
    pub texts_drawn: u64,
}

/// What the browser made of a page: its SVGs, the errors it met, the resources it fetched, and
/// how many pixels of the screenshot were white and of each of the first two series' colours.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub svgs: Vec<SvgProbe>,
    pub errors: Vec<String>,
    pub resources: Vec<String>,
    pub pixels: usize,
    pub white_pixels: usize,
    pub series_pixels: [usize; 2],
}

/// Records errors from the first moment, then at `load` writes what the browser laid out into
/// the DOM that --dump-dom prints: per SVG its box, its shapes and texts, and how many of each
/// have a non-empty box (drawn); the errors; the resources fetched.
const PROBE_HEAD: &str = "<script>window.__errors=[];\
addEventListener('error',e=>__errors.push(String(e.message||(e.target&&e.target.outerHTML))),true);\
</script>";
const PROBE_BODY: &str = "<script>addEventListener('load',()=>{\
const drawn=els=>els.filter(e=>{const b=e.getBBox();return b.width>0||b.height>0}).length;\
const svgs=[...document.querySelectorAll('svg')].map(s=>{\
const r=s.getBoundingClientRect();\
const shapes=[...s.querySelectorAll('rect,polyline,line,circle,path,polygon')];\
const texts=[...s.querySelectorAll('text')];\
return {width:r.width,height:r.height,shapes:shapes.length,shapes_drawn:drawn(shapes),\
texts:texts.length,texts_drawn:drawn(texts)}});\
const p=document.createElement('pre');p.id='probe';\
p.textContent=JSON.stringify({svgs,errors:__errors,\
resources:performance.getEntriesByType('resource').map(r=>r.name)});\
document.body.appendChild(p)});</script>";

/// Loads `page` in `chromium` and checks that it has `charts` charts, loaded without an error
/// or an outside request, every chart at least 300 x 200 with more than 10 shapes and 5 texts,
/// all laid out, and painted: not blank, each of the first two series' colours over 500
/// pixels of the screenshot (`height` tall, 1000 wide). Answers what the browser saw.
pub fn check_page(
    chromium: &Path,
    page: &Path,
    charts: usize,
    height: u32,
) -> Result<Probe, BrowserError> {
    let probe = probe_page(chromium, page, height)?;
    let fail = |what: String| BrowserError::Failed {
        page: page.display().to_string(),
        what,
    };
    if !probe.errors.is_empty() {
        return Err(fail(format!("errors: {:?}", probe.errors)));
    }
    if !probe.resources.is_empty() {
        return Err(fail(format!("the page fetched {:?}", probe.resources)));
    }
    if probe.svgs.len() != charts {
        return Err(fail(format!(
            "{} charts laid out, {charts} expected: {:?}",
            probe.svgs.len(),
            probe.svgs
        )));
    }
    for (i, svg) in probe.svgs.iter().enumerate() {
        if !(svg.width > 300.0 && svg.height > 200.0 && svg.shapes > 10 && svg.texts > 5) {
            return Err(fail(format!("chart {i} too small or too bare: {svg:?}")));
        }
        if svg.shapes_drawn != svg.shapes || svg.texts_drawn != svg.texts {
            return Err(fail(format!(
                "chart {i}: not every shape and text laid out (a font?): {svg:?}"
            )));
        }
    }
    if probe.white_pixels >= probe.pixels * 97 / 100 {
        return Err(fail(format!(
            "the page is blank: {} of {} pixels white",
            probe.white_pixels, probe.pixels
        )));
    }
    for (series, count) in probe.series_pixels.iter().enumerate() {
        if *count <= 500 {
            return Err(fail(format!(
                "series {series}: {count} pixels of its colour on the screenshot"
            )));
        }
    }
    Ok(probe)
}

/// What the browser made of `page` (see [`Probe`]), checking nothing.
pub fn probe_page(chromium: &Path, page: &Path, height: u32) -> Result<Probe, BrowserError> {
    let io = |what: String| move |e| BrowserError::Io(what, e);
    let page = page
        .canonicalize()
        .map_err(io(format!("{}", page.display())))?;
    let scratch = std::env::temp_dir().join(format!(
        "semaphore-charts-browser-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&scratch).map_err(io(format!("{}", scratch.display())))?;
    let html = std::fs::read_to_string(&page).map_err(io(format!("{}", page.display())))?;
    let probed = html
        .replacen("<head>", &format!("<head>{PROBE_HEAD}"), 1)
        .replacen("</body>", &format!("{PROBE_BODY}</body>"), 1);
    let probed_path = scratch.join("probed.html");
    std::fs::write(&probed_path, probed).map_err(io(format!("{}", probed_path.display())))?;

    let dom = run(
        chromium,
        &scratch,
        &[
            "--dump-dom".into(),
            format!("file://{}", probed_path.display()),
        ],
    )?;
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    let json = dom_text
        .split_once("<pre id=\"probe\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        // The text as HTML serialises it: only &, < and > escaped.
        .map(|(json, _)| {
            json.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&")
        })
        .ok_or_else(|| BrowserError::NoProbe {
            page: page.display().to_string(),
            status: format!("{:?}", dom.status),
            stderr: String::from_utf8_lossy(&dom.stderr).into_owned(),
        })?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let strings = |key: &str| -> Vec<String> {
        v[key]
            .as_array()
            .map(|a| a.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default()
    };
    let number = |s: &serde_json::Value, key: &str| s[key].as_f64().unwrap_or(-1.0);
    let svgs = v["svgs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| SvgProbe {
                    width: number(s, "width"),
                    height: number(s, "height"),
                    shapes: s["shapes"].as_u64().unwrap_or(0),
                    shapes_drawn: s["shapes_drawn"].as_u64().unwrap_or(0),
                    texts: s["texts"].as_u64().unwrap_or(0),
                    texts_drawn: s["texts_drawn"].as_u64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default();

    // Painted: the page as written, on a screenshot.
    let png = scratch.join("page.png");
    let shot = run(
        chromium,
        &scratch,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size=1000,{height}"),
            format!("file://{}", page.display()),
        ],
    )?;
    if !png.is_file() {
        return Err(BrowserError::Png(format!(
            "none written: {}",
            String::from_utf8_lossy(&shot.stderr)
        )));
    }
    let pixels = rgb_pixels(&png)?;
    let of =
        |c: plotters::style::RGBColor| pixels.iter().filter(|p| **p == [c.0, c.1, c.2]).count();
    let probe = Probe {
        svgs,
        errors: strings("errors"),
        resources: strings("resources"),
        pixels: pixels.len(),
        white_pixels: pixels.iter().filter(|p| **p == [255, 255, 255]).count(),
        series_pixels: [of(colour(0)), of(colour(1))],
    };
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(probe)
}

/// Runs Chromium headless with `args`, killed if it takes over 90 s.
fn run(
    chromium: &Path,
    scratch: &Path,
    args: &[String],
) -> Result<std::process::Output, BrowserError> {
    let profile = scratch.join(format!("profile-{}", args.len()));
    let child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BrowserError::Io(chromium.display().to_string(), e))?;
    let id = child.id();
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(output) => output.map_err(|e| BrowserError::Io(chromium.display().to_string(), e)),
        Err(_) => {
            // Only the process this helper started.
            let _ = Command::new("kill").arg(id.to_string()).status();
            Err(BrowserError::Timeout(
                started.elapsed(),
                format!("{args:?}"),
            ))
        }
    }
}

/// The RGB of every pixel of an 8-bit PNG.
pub fn rgb_pixels(path: &Path) -> Result<Vec<[u8; 3]>, BrowserError> {
    let bad = |e: &dyn std::fmt::Display| BrowserError::Png(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| bad(&e))?;
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .map_err(|e| bad(&e))?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| bad(&"no buffer size"))?;
    let mut buf = vec![0; size];
    let info = reader.next_frame(&mut buf).map_err(|e| bad(&e))?;
    let step = info.color_type.samples();
    if step < 3 || info.bit_depth != png::BitDepth::Eight {
        return Err(bad(&format!("not 8-bit RGB: {info:?}")));
    }
    Ok(buf[..info.buffer_size()]
        .chunks(step)
        .map(|p| [p[0], p[1], p[2]])
        .collect())
}
