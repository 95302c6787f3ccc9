//! The report's charts as data, drawn with plotters to SVG (text as `<text>` elements) and to
//! PNG (an RGB bitmap in memory, text drawn with ab_glyph from the embedded DejaVu Sans, encoded
//! by the `png` crate): no system font library is involved. Pure functions from a chart to bytes.

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::store::picture::{FAMILY, register_font};

pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 600;

/// One series of an x–y chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// A line through the points (a fitted or formula curve) instead of markers.
    pub line: bool,
    /// Index into the palette (a measured series and its curve share one).
    pub color: usize,
}

/// Ten colours that stay apart on white (the Tableau 10 palette).
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
}

/// Stacked bars: one bar per category, one segment per stack.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub stacks: Vec<(String, Vec<f64>)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Chart {
    Xy(XyChart),
    Bars(BarChart),
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
            (lo, hi + 0.08 * span)
        }
    };
    Some((pad(x0, x1), pad(y0, y1)))
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

macro_rules! draw_xy_body {
    ($root:expr, $chart:expr, $xr:expr, $yr:expr) => {{
        let c = $chart;
        let mut ctx = ChartBuilder::on($root)
            .caption(&c.title, (FAMILY, 24))
            .margin(16)
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
                .map_err(err)?
                .label("y = x")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
            }
        }
        for s in c.series.iter() {
            let color = color(s.color);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| !c.log || (*x > 0.0 && *y > 0.0))
                .collect();
            if s.line {
                ctx.draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            } else {
                ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
            }
        }
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
    }};
}

fn draw_xy<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &XyChart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let ((x0, x1), (y0, y1)) = bounds(c).context("a chart without points")?;
    if c.log {
        draw_xy_body!(root, c, (x0..x1).log_scale(), (y0..y1).log_scale());
    } else {
        draw_xy_body!(root, c, x0..x1, y0..y1);
    }
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &BarChart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let n = c.categories.len();
    anyhow::ensure!(n > 0, "a bar chart without bars");
    // A bar with a missing (NaN) segment says so under it: the segment is not drawn as 0.
    let names: Vec<String> = (0..n)
        .map(|i| {
            let missing = c.stacks.iter().any(|(_, v)| !v[i].is_finite());
            format!(
                "{}{}",
                c.categories[i],
                if missing { " (— missing)" } else { "" }
            )
        })
        .collect();
    // Labels wider than a bar are written upwards under it.
    let longest = names.iter().map(|s| s.chars().count()).max().unwrap_or(0) as u32;
    let per_bar = (WIDTH - 120) / n as u32;
    let rotate = longest * 7 > per_bar;
    let label_area = if rotate {
        (longest * 7 + 16).min(300)
    } else {
        64
    };
    let top = (0..n)
        .map(|i| {
            c.stacks
                .iter()
                .map(|(_, v)| if v[i].is_finite() { v[i].max(0.0) } else { 0.0 })
                .sum::<f64>()
        })
        .fold(0.0, f64::max)
        .max(1e-9)
        // Headroom for the legend above the tallest bar.
        * (1.1 + 0.07 * c.stacks.len() as f64);
    let mut ctx = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, 24))
        .margin(16)
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
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 17))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    let mut base = vec![0.0; n];
    for (k, (name, vals)) in c.stacks.iter().enumerate() {
        let color = color(k);
        let rects: Vec<Rectangle<(SegmentValue<usize>, f64)>> = (0..n)
            .filter(|&i| vals[i].is_finite())
            .map(|i| {
                let (y0, y1) = (base[i], base[i] + vals[i].max(0.0));
                base[i] = y1;
                let mut r = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), y0),
                        (SegmentValue::Exact(i + 1), y1),
                    ],
                    color.filled(),
                );
                r.set_margin(0, 0, 12, 12);
                r
            })
            .collect();
        ctx.draw_series(rects)
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    if rotate {
        // Each label runs down from under its bar (rotated a quarter turn clockwise).
        let style = TextStyle::from((FAMILY, 12).into_font()).transform(FontTransform::Rotate90);
        for (i, name) in names.iter().enumerate() {
            let (x, y) = ctx.backend_coord(&(SegmentValue::CenterOf(i), 0.0));
            root.draw(&Text::new(name.clone(), (x + 6, y + 6), style.clone()))
                .map_err(err)?;
        }
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, chart: &Chart) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    match chart {
        Chart::Xy(c) => draw_xy(&root, c)?,
        Chart::Bars(c) => draw_bars(&root, c)?,
    }
    root.present().map_err(err)
}

/// The chart as an SVG document.
pub fn svg(chart: &Chart) -> anyhow::Result<String> {
    // plotters measures text with the font even for SVG (layout of labels and legends).
    register_font();
    let mut s = String::new();
    draw(
        SVGBackend::with_string(&mut s, (WIDTH, HEIGHT)).into_drawing_area(),
        chart,
    )?;
    Ok(s)
}

/// The chart as a PNG file's bytes.
pub fn png(chart: &Chart) -> anyhow::Result<Vec<u8>> {
    register_font();
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    draw(
        BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area(),
        chart,
    )?;
    let mut out = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut out),
        &rgb,
        WIDTH,
        HEIGHT,
        image::ExtendedColorType::Rgb8,
    )
    .context("encoding a PNG")?;
    Ok(out)
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
        });
        let s = svg(&bars).unwrap();
        // plotters writes a text element's content on its own line.
        assert!(
            s.contains(">\na\n</text>") && s.contains(">\nb\n</text>"),
            "{s}"
        );
        assert!(png(&bars).is_ok());
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.5), "0.5");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(1024.0), "1024");
        assert_eq!(tick(3.0), "3");
    }
}
