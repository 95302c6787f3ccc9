//! The report's charts as data, drawn with plotters to SVG (text as `<text>` elements) and to
//! PNG (an RGB bitmap in memory, text drawn with ab_glyph from the embedded DejaVu Sans, encoded
//! by the `png` crate): no system font library is involved. Pure functions from a chart to bytes.

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::store::picture::{FAMILY, register_font};

pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 600;
/// The legend's column, right of the data area (a legend never covers data).
pub const LEGEND_WIDTH: u32 = 280;
/// The width of a narrow chart (shown at half the page's width: drawn smaller so that its
/// text stays legible there) and of its legend column.
pub const NARROW: u32 = 720;
const NARROW_LEGEND_WIDTH: u32 = 210;

/// The legend column's width in a chart `w` pixels wide.
fn legend_width(w: u32) -> u32 {
    if w <= NARROW {
        NARROW_LEGEND_WIDTH
    } else {
        LEGEND_WIDTH
    }
}
/// The most legend entries one panel carries: more series are faceted into panels.
pub const MAX_LEGEND: usize = 10;
/// The height of one panel of a [`Panels`] chart.
const PANEL_HEIGHT: u32 = 420;

/// One series of an x–y chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend entry; empty: none of its own (a curve drawn with its measured points in
    /// the same colour shares their entry, which then shows the marker and the line).
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// A line through the points (a fitted or formula curve) instead of markers.
    pub line: bool,
    /// Index into the palette (a measured series and its curve share one).
    pub color: usize,
}

/// Ten colours that stay apart on white (the Tableau 10 palette). A panel has at most
/// [`MAX_LEGEND`] entries, so its colours never repeat.
const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// The number of distinct colours.
pub const COLOURS: usize = PALETTE.len();

fn color(i: usize) -> RGBAColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b).to_rgba()
}

/// Points and curves on linear or log-log axes.
#[derive(Debug, Clone, PartialEq)]
pub struct XyChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log: bool,
    /// Draw the line y = x.
    pub diagonal: bool,
    pub series: Vec<Series>,
    /// Drawn [`NARROW`] pixels wide.
    pub narrow: bool,
}

/// Stacked bars: one bar per category, one segment per stack.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    /// The value axis's title, with its unit.
    pub y_label: String,
    pub categories: Vec<String>,
    pub stacks: Vec<(String, Vec<f64>)>,
    /// Where the value axis ends (shares: 100); `None`: just above the tallest bar.
    pub y_max: Option<f64>,
    /// Bars run across, the categories down the side with their labels written level (for
    /// many categories with long labels).
    pub horizontal: bool,
    /// Drawn [`NARROW`] pixels wide.
    pub narrow: bool,
}

/// X–y panels one above the other under one title (a chart with more series than a legend
/// can carry, faceted).
#[derive(Debug, Clone, PartialEq)]
pub struct Panels {
    pub title: String,
    pub panels: Vec<XyChart>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Chart {
    Xy(XyChart),
    Bars(BarChart),
    Panels(Panels),
}

/// What a legend entry shows beside its name.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Key {
    Marker(usize),
    Line(usize),
    /// Measured points and their curve.
    MarkerAndLine(usize),
    Bar(usize),
    /// The y = x line.
    Diagonal,
}

impl Chart {
    pub fn title(&self) -> &str {
        match self {
            Chart::Xy(c) => &c.title,
            Chart::Bars(c) => &c.title,
            Chart::Panels(p) => &p.title,
        }
    }

    /// The picture's size in pixels (SVG units): panels stack, level bars take a row each.
    pub fn size(&self) -> (u32, u32) {
        match self {
            Chart::Panels(p) => (WIDTH, 50 + PANEL_HEIGHT * p.panels.len().max(1) as u32),
            Chart::Bars(b) if b.horizontal => (
                if b.narrow { NARROW } else { WIDTH },
                (130 + 30 * b.categories.len() as u32).max(HEIGHT / 2),
            ),
            Chart::Bars(BarChart { narrow: true, .. }) => (NARROW, HEIGHT),
            Chart::Xy(XyChart { narrow: true, .. }) => (NARROW, HEIGHT * 3 / 4 + 60),
            _ => (WIDTH, HEIGHT),
        }
    }

    /// The legend entries' names, one list per panel (one list for a single chart).
    pub fn legends(&self) -> Vec<Vec<String>> {
        let names = |k: Vec<(String, Key)>| k.into_iter().map(|(n, _)| n).collect();
        match self {
            Chart::Xy(c) => vec![names(xy_legend(c))],
            Chart::Bars(c) => vec![names(bar_legend(c))],
            Chart::Panels(p) => p.panels.iter().map(|c| names(xy_legend(c))).collect(),
        }
    }
}

/// A tick label: up to 4 significant digits, no exponent for ordinary sizes.
pub fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn bounds(chart: &XyChart) -> Option<((f64, f64), (f64, f64))> {
    let pts: Vec<(f64, f64)> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.log || (*x > 0.0 && *y > 0.0)))
        .collect();
    if pts.is_empty() {
        return None;
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if chart.diagonal {
        let (lo, hi) = (x0.min(y0), x1.max(y1));
        (x0, x1, y0, y1) = (lo, hi, lo, hi);
    }
    let pad = |lo: f64, hi: f64| {
        if chart.log {
            (lo / 1.5, hi * 1.5)
        } else {
            // Linear axes start at 0 (memory and sizes are never negative here).
            let lo = lo.min(0.0);
            let span = (hi - lo).max(1e-9);
            (lo, hi + 0.05 * span)
        }
    };
    Some((pad(x0, x1), pad(y0, y1)))
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// The legend of an x–y chart: the diagonal, then each named series; a named series whose
/// colour an unnamed series of the other kind shares shows both marks.
fn xy_legend(c: &XyChart) -> Vec<(String, Key)> {
    let mut out = Vec::new();
    if c.diagonal {
        out.push(("y = x".to_string(), Key::Diagonal));
    }
    for s in c.series.iter().filter(|s| !s.name.is_empty()) {
        let partner = c
            .series
            .iter()
            .any(|t| t.name.is_empty() && t.color == s.color && t.line != s.line);
        let key = match (partner, s.line) {
            (true, _) => Key::MarkerAndLine(s.color),
            (false, true) => Key::Line(s.color),
            (false, false) => Key::Marker(s.color),
        };
        out.push((s.name.clone(), key));
    }
    out
}

fn bar_legend(c: &BarChart) -> Vec<(String, Key)> {
    c.stacks
        .iter()
        .enumerate()
        .map(|(k, (name, _))| (name.clone(), Key::Bar(k)))
        .collect()
}

/// `text` broken at spaces into lines no wider than `width` pixels.
fn wrap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    style: &TextStyle,
    width: u32,
) -> Vec<String> {
    let fits = |s: &str| {
        area.estimate_text_size(s, style)
            .map_or(true, |(w, _)| w <= width)
    };
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let longer = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if line.is_empty() || fits(&longer) {
            line = longer;
        } else {
            lines.push(std::mem::take(&mut line));
            line = word.to_string();
        }
    }
    lines.push(line);
    lines
}

/// The legend, in its own column (`area`), from `top` pixels down: each entry's mark and its
/// name, wrapped to the column.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Key)],
    top: i32,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let style = TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let (w, _) = area.dim_in_pixel();
    let (x, text_x) = (4, 36);
    let mut y = top + 8;
    for (name, key) in entries {
        match *key {
            Key::Marker(c) => area
                .draw(&Circle::new((x + 12, y), 5, color(c).filled()))
                .map_err(err)?,
            Key::Line(c) => area
                .draw(&PathElement::new(
                    vec![(x, y), (x + 24, y)],
                    color(c).stroke_width(3),
                ))
                .map_err(err)?,
            Key::MarkerAndLine(c) => {
                area.draw(&PathElement::new(
                    vec![(x, y), (x + 24, y)],
                    color(c).stroke_width(2),
                ))
                .map_err(err)?;
                area.draw(&Circle::new((x + 12, y), 5, color(c).filled()))
                    .map_err(err)?
            }
            Key::Bar(c) => area
                .draw(&Rectangle::new(
                    [(x + 4, y - 7), (x + 20, y + 7)],
                    color(c).filled(),
                ))
                .map_err(err)?,
            Key::Diagonal => area
                .draw(&PathElement::new(
                    vec![(x, y), (x + 24, y)],
                    BLACK.mix(0.5).stroke_width(1),
                ))
                .map_err(err)?,
        }
        for line in wrap(area, name, &style, w.saturating_sub(text_x as u32 + 16)) {
            area.draw_text(&line, &style, (text_x, y)).map_err(err)?;
            y += 18;
        }
        y += 8;
    }
    Ok(())
}

/// Top of the data area within the chart area (the legend starts level with it).
const PLOT_TOP: i32 = 16;

macro_rules! draw_xy_body {
    ($root:expr, $chart:expr, $xr:expr, $yr:expr) => {{
        let c = $chart;
        let mut ctx = ChartBuilder::on($root)
            .margin(PLOT_TOP as u32)
            .x_label_area_size(56)
            .y_label_area_size(84)
            .build_cartesian_2d($xr, $yr)
            .map_err(err)?;
        ctx.configure_mesh()
            .x_desc(c.x_label.as_str())
            .y_desc(c.y_label.as_str())
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .label_style((FAMILY, 15))
            .axis_desc_style((FAMILY, 17))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        if c.diagonal {
            if let Some(((x0, x1), _)) = bounds(c) {
                ctx.draw_series(LineSeries::new(
                    [(x0, x0), (x1, x1)],
                    ShapeStyle::from(&BLACK.mix(0.5)).stroke_width(1),
                ))
                .map_err(err)?;
            }
        }
        // Curves first, the measured points over them.
        for s in c.series.iter().filter(|s| s.line) {
            let pts = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| !c.log || (*x > 0.0 && *y > 0.0));
            ctx.draw_series(LineSeries::new(pts, color(s.color).stroke_width(2)))
                .map_err(err)?;
        }
        for s in c.series.iter().filter(|s| !s.line) {
            let pts = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| !c.log || (*x > 0.0 && *y > 0.0));
            let fill = color(s.color).filled();
            ctx.draw_series(pts.map(|p| Circle::new(p, 5, fill)))
                .map_err(err)?;
        }
    }};
}

/// An x–y chart in `area`: the data left, the legend in a column right of it.
fn draw_xy<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &XyChart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let ((x0, x1), (y0, y1)) = bounds(c).context("a chart without points")?;
    let (w, _) = area.dim_in_pixel();
    let (plot, legend) = area.split_horizontally(w.saturating_sub(legend_width(w)));
    if c.log {
        draw_xy_body!(&plot, c, (x0..x1).log_scale(), (y0..y1).log_scale());
    } else {
        draw_xy_body!(&plot, c, x0..x1, y0..y1);
    }
    draw_legend(&legend, &xy_legend(c), PLOT_TOP)
}

fn draw_bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &BarChart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let n = c.categories.len();
    anyhow::ensure!(n > 0, "a bar chart without bars");
    // A bar with a missing (NaN) segment names it under the bar: the segment is not drawn as 0.
    let names: Vec<String> = (0..n)
        .map(|i| {
            let missing: Vec<&str> = c
                .stacks
                .iter()
                .filter(|(_, v)| !v[i].is_finite())
                .map(|(s, _)| s.split(" (").next().unwrap_or(s))
                .collect();
            if missing.is_empty() {
                c.categories[i].clone()
            } else {
                format!("{} (no {})", c.categories[i], missing.join(", "))
            }
        })
        .collect();
    let (w, _) = area.dim_in_pixel();
    let (plot, legend) = area.split_horizontally(w.saturating_sub(legend_width(w)));
    let top = c.y_max.unwrap_or_else(|| {
        (0..n)
            .map(|i| {
                c.stacks
                    .iter()
                    .map(|(_, v)| if v[i].is_finite() { v[i].max(0.0) } else { 0.0 })
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.05
    });
    let label_style = TextStyle::from((FAMILY, 14).into_font());
    let longest = names
        .iter()
        .map(|s| {
            plot.estimate_text_size(s, &label_style)
                .map_or(0, |(w, _)| w)
        })
        .max()
        .unwrap_or(0);
    if c.horizontal {
        // Categories top to bottom in their order: segment n − 1 − i is category i.
        let mut ctx = ChartBuilder::on(&plot)
            .margin(PLOT_TOP as u32)
            .x_label_area_size(56)
            .y_label_area_size(longest + 16)
            .build_cartesian_2d(0.0..top, (0..n - 1).into_segmented())
            .map_err(err)?;
        ctx.configure_mesh()
            .disable_y_mesh()
            .x_desc(c.y_label.as_str())
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(n - 1 - *i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_label_formatter(&|v| tick(*v))
            .label_style(label_style.clone())
            .axis_desc_style((FAMILY, 17))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (k, spans) in stacked_spans(&c.stacks, n).into_iter().enumerate() {
            let rects = spans.into_iter().map(|(i, x0, x1)| {
                let row = n - 1 - i;
                let mut r = Rectangle::new(
                    [
                        (x0, SegmentValue::Exact(row)),
                        (x1, SegmentValue::Exact(row + 1)),
                    ],
                    color(k).filled(),
                );
                r.set_margin(4, 4, 0, 0);
                r
            });
            ctx.draw_series(rects).map_err(err)?;
        }
    } else {
        // Labels wider than a bar are written upwards under it.
        let (pw, _) = plot.dim_in_pixel();
        let per_bar = pw.saturating_sub(120) / n as u32;
        let rotate = longest > per_bar;
        let label_area = if rotate { (longest + 16).min(300) } else { 64 };
        let mut ctx = ChartBuilder::on(&plot)
            .margin(PLOT_TOP as u32)
            .x_label_area_size(label_area)
            .y_label_area_size(84)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..top)
            .map_err(err)?;
        ctx.configure_mesh()
            .disable_x_mesh()
            .y_desc(c.y_label.as_str())
            .x_labels(n)
            .x_label_formatter(&|v| match v {
                // Long labels are drawn below, rotated.
                SegmentValue::CenterOf(i) if !rotate => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .y_label_formatter(&|v| tick(*v))
            .label_style(label_style.clone())
            .axis_desc_style((FAMILY, 17))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (k, spans) in stacked_spans(&c.stacks, n).into_iter().enumerate() {
            let rects = spans.into_iter().map(|(i, y0, y1)| {
                let mut r = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), y0),
                        (SegmentValue::Exact(i + 1), y1),
                    ],
                    color(k).filled(),
                );
                r.set_margin(0, 0, 12, 12);
                r
            });
            ctx.draw_series(rects).map_err(err)?;
        }
        if rotate {
            // Each label runs up from under its bar (rotated a quarter turn anticlockwise).
            let style = TextStyle::from((FAMILY, 13).into_font())
                .transform(FontTransform::Rotate270)
                .pos(Pos::new(HPos::Right, VPos::Center));
            for (i, name) in names.iter().enumerate() {
                let (x, y) = ctx.backend_coord(&(SegmentValue::CenterOf(i), 0.0));
                area.draw(&Text::new(name.clone(), (x, y + 8), style.clone()))
                    .map_err(err)?;
            }
        }
    }
    draw_legend(&legend, &bar_legend(c), PLOT_TOP)
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, chart: &Chart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    // The title at 24 px, smaller where it would not fit the width.
    let (w, _) = root.dim_in_pixel();
    let size = (16..=24)
        .rev()
        .find(|&px| {
            root.estimate_text_size(chart.title(), &(FAMILY, px).into_font().into())
                .is_ok_and(|(tw, _)| tw + 24 <= w)
        })
        .unwrap_or(16);
    let area = root
        .margin(8, 0, 0, 0)
        .titled(chart.title(), (FAMILY, size))
        .map_err(err)?;
    match chart {
        Chart::Xy(c) => draw_xy(&area, c)?,
        Chart::Bars(c) => draw_bars(&area, c)?,
        Chart::Panels(p) => {
            for (panel, c) in area
                .split_evenly((p.panels.len().max(1), 1))
                .iter()
                .zip(&p.panels)
            {
                let inner = panel.titled(&c.title, (FAMILY, 18)).map_err(err)?;
                draw_xy(&inner, c)?;
            }
        }
    }
    root.present().map_err(err)
}

/// The chart as an SVG document.
pub fn svg(chart: &Chart) -> anyhow::Result<String> {
    // plotters measures text with the font even for SVG (layout of labels and legends).
    register_font();
    let mut s = String::new();
    draw(
        SVGBackend::with_string(&mut s, chart.size()).into_drawing_area(),
        chart,
    )?;
    Ok(s)
}

/// The chart as a PNG file's bytes.
pub fn png(chart: &Chart) -> anyhow::Result<Vec<u8>> {
    register_font();
    let (w, h) = chart.size();
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    draw(
        BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area(),
        chart,
    )?;
    let mut out = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut out),
        &rgb,
        w,
        h,
        image::ExtendedColorType::Rgb8,
    )
    .context("encoding a PNG")?;
    Ok(out)
}

/// Each series' segments of `n` stacked bars, series by series: `(bar, from, to)`, each bar's
/// total growing as the series stack up (a value that is not finite is left out, a negative one
/// drawn empty).
fn stacked_spans(stacks: &[(String, Vec<f64>)], n: usize) -> Vec<Vec<(usize, f64, f64)>> {
    let mut base = vec![0.0; n];
    stacks
        .iter()
        .map(|(_, vals)| {
            (0..n)
                .filter(|&i| vals[i].is_finite())
                .map(|i| {
                    let (lo, hi) = (base[i], base[i] + vals[i].max(0.0));
                    base[i] = hi;
                    (i, lo, hi)
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xy() -> Chart {
        Chart::Xy(XyChart {
            title: "predicted vs measured".into(),
            x_label: "measured peak (MiB)".into(),
            y_label: "predicted peak (MiB)".into(),
            log: true,
            diagonal: true,
            series: vec![Series {
                name: "forward".into(),
                points: vec![(1.0, 1.1), (10.0, 9.0), (100.0, 100.0)],
                line: false,
                color: 0,
            }],
            narrow: false,
        })
    }

    #[test]
    fn svg_and_png_are_drawn() {
        let s = svg(&xy()).unwrap();
        assert!(s.contains("<svg") && s.contains("measured peak (MiB)") && s.contains("forward"));
        let p = png(&xy()).unwrap();
        assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
        let bars = Chart::Bars(BarChart {
            title: "t".into(),
            y_label: "MiB".into(),
            categories: vec!["a".into(), "b".into()],
            stacks: vec![("w".into(), vec![1.0, 2.0]), ("g".into(), vec![3.0, 0.5])],
            y_max: None,
            horizontal: false,
            narrow: false,
        });
        let s = svg(&bars).unwrap();
        // plotters writes a text element's content on its own line.
        assert!(
            s.contains(">\na\n</text>") && s.contains(">\nb\n</text>"),
            "{s}"
        );
        assert!(png(&bars).is_ok());
    }

    /// A curve drawn with its measured points (same colour, no name of its own) shares their
    /// legend entry; the legend sits right of the data area, whose colours then stay apart.
    #[test]
    fn a_curve_shares_its_points_legend_entry() {
        let s = |name: &str, line: bool, color: usize| Series {
            name: name.into(),
            points: vec![(1.0, 1.0), (2.0, 2.0)],
            line,
            color,
        };
        let c = Chart::Xy(XyChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log: false,
            diagonal: false,
            series: vec![s("a", false, 0), s("", true, 0), s("b curve", true, 1)],
            narrow: false,
        });
        assert_eq!(
            c.legends(),
            vec![vec!["a".to_string(), "b curve".to_string()]]
        );
        let Chart::Xy(xy) = &c else { unreachable!() };
        assert_eq!(
            xy_legend(xy).iter().map(|(_, k)| *k).collect::<Vec<_>>(),
            vec![Key::MarkerAndLine(0), Key::Line(1)]
        );
        // The legend's text is right of the data area (the last LEGEND_WIDTH pixels).
        let svg = svg(&c).unwrap();
        let at = svg.find(">\nb curve\n</text>").expect("the legend entry");
        let tag = &svg[svg[..at].rfind("<text").unwrap()..at];
        let x: f64 = tag
            .split("x=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(x > f64::from(WIDTH - LEGEND_WIDTH), "{tag}");
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.5), "0.5");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(1024.0), "1024");
        assert_eq!(tick(3.0), "3");
    }
}
