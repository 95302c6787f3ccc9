//! memfit's own pictures (the timeline's stacked areas, `predict --plot`'s bars) as a list of
//! marks drawn twice: as SVG text (one element a line) and as a PNG bitmap through plotters'
//! bitmap backend, its text drawn by ab_glyph from the embedded DejaVu Sans — so a `.png` needs
//! no system font or SVG renderer and shows what the `.svg` shows.

use std::io::Write;

use anyhow::{Context, anyhow};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// DejaVu Sans 2.37 (Bitstream Vera licence, `assets/fonts/LICENSE-DejaVu.txt`).
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// The font family every picture names (the embedded DejaVu Sans in bitmaps).
pub const FAMILY: &str = "sans-serif";

/// Registers the embedded font with plotters (once; plotters measures text with it even for
/// SVG). Bold text is drawn with the same face.
pub fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            plotters::style::register_font(FAMILY, style, FONT)
                .unwrap_or_else(|_| panic!("the embedded DejaVu Sans is a valid font"));
        }
    });
}

/// Where a text's `x` is: its start, middle or end (SVG's `text-anchor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// One drawn thing, in the picture's coordinates (pixels of the SVG; y down). Colours are
/// `#rrggbb` or one of `black`, `white`, `red`.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// A filled rectangle with a tooltip (SVG `<title>`).
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: &'static str,
        title: Option<String>,
    },
    Polygon {
        points: Vec<(f64, f64)>,
        fill: &'static str,
    },
    Line {
        from: (f64, f64),
        to: (f64, f64),
        stroke: &'static str,
        width: f64,
        /// Dash and gap lengths.
        dash: Option<(f64, f64)>,
    },
    Circle {
        at: (f64, f64),
        r: f64,
        fill: &'static str,
    },
    Text(Text),
}

/// Text whose baseline is at `at.1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Text {
    pub at: (f64, f64),
    pub text: String,
    pub anchor: Anchor,
    pub fill: &'static str,
    pub size: f64,
    pub bold: bool,
    /// Written upwards (turned a quarter anticlockwise about `at`): an axis title at the side.
    pub upwards: bool,
}

impl Text {
    /// Plain text: 12 px, black, starting at `at`.
    pub fn new(at: (f64, f64), text: impl Into<String>) -> Text {
        Text {
            at,
            text: text.into(),
            anchor: Anchor::Start,
            fill: "black",
            size: 12.0,
            bold: false,
            upwards: false,
        }
    }

    pub fn anchor(self, anchor: Anchor) -> Text {
        Text { anchor, ..self }
    }

    pub fn fill(self, fill: &'static str) -> Text {
        Text { fill, ..self }
    }

    pub fn size(self, size: f64) -> Text {
        Text { size, ..self }
    }

    pub fn bold(self) -> Text {
        Text { bold: true, ..self }
    }

    pub fn upwards(self) -> Text {
        Text {
            upwards: true,
            ..self
        }
    }
}

impl From<Text> for Mark {
    fn from(t: Text) -> Mark {
        Mark::Text(t)
    }
}

impl Mark {
    /// Plain text (see [`Text::new`]).
    pub fn text(at: (f64, f64), text: impl Into<String>) -> Mark {
        Mark::Text(Text::new(at, text))
    }

    /// A solid line one pixel wide.
    pub fn line(from: (f64, f64), to: (f64, f64), stroke: &'static str) -> Mark {
        Mark::Line {
            from,
            to,
            stroke,
            width: 1.0,
            dash: None,
        }
    }
}

/// A picture: its size and marks, drawn in order on white.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Picture {
    pub size: (f64, f64),
    pub marks: Vec<Mark>,
}

/// The file kinds a picture is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format `path`'s extension names (`.svg`, `.png`), if any.
    pub fn of(path: &std::path::Path) -> Option<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("svg") => Some(Format::Svg),
            Some("png") => Some(Format::Png),
            _ => None,
        }
    }
}

/// A bitmap's pixels per picture unit: PNGs are drawn at twice the SVG's size, so text stays
/// sharp on a high-density screen.
pub const PNG_SCALE: f64 = 2.0;

impl Picture {
    pub fn new(size: (f64, f64)) -> Self {
        Picture {
            size,
            marks: Vec::new(),
        }
    }

    pub fn push(&mut self, m: Mark) {
        self.marks.push(m);
    }

    /// Writes the picture as `format` to `out`.
    pub fn write(&self, out: &mut impl Write, format: Format) -> anyhow::Result<()> {
        match format {
            Format::Svg => self.svg(out).context("writing an SVG")?,
            Format::Png => out.write_all(&self.png()?).context("writing a PNG")?,
        }
        Ok(())
    }

    /// The picture as an SVG document.
    pub fn svg(&self, out: &mut impl Write) -> std::io::Result<()> {
        let (w, h) = self.size;
        writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FAMILY}" font-size="12">"#
        )?;
        writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#)?;
        for m in &self.marks {
            match m {
                Mark::Rect {
                    x,
                    y,
                    w,
                    h,
                    fill,
                    title,
                } => match title {
                    Some(t) => writeln!(
                        out,
                        r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}"><title>{}</title></rect>"#,
                        escape(t)
                    )?,
                    None => writeln!(
                        out,
                        r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}"/>"#
                    )?,
                },
                Mark::Polygon { points, fill } => {
                    let pts: Vec<String> = points
                        .iter()
                        .map(|(x, y)| format!("{x:.1},{y:.1}"))
                        .collect();
                    writeln!(
                        out,
                        r#"<polygon points="{}" fill="{fill}" stroke="none"/>"#,
                        pts.join(" ")
                    )?
                }
                Mark::Line {
                    from,
                    to,
                    stroke,
                    width,
                    dash,
                } => {
                    let dash = dash.map_or(String::new(), |(a, b)| {
                        format!(r#" stroke-dasharray="{a} {b}""#)
                    });
                    let width = if *width == 1.0 {
                        String::new()
                    } else {
                        format!(r#" stroke-width="{width}""#)
                    };
                    writeln!(
                        out,
                        r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{stroke}"{width}{dash}/>"#,
                        from.0, from.1, to.0, to.1
                    )?
                }
                Mark::Circle { at, r, fill } => writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{fill}"/>"#,
                    at.0, at.1
                )?,
                Mark::Text(Text {
                    at,
                    text,
                    anchor,
                    fill,
                    size,
                    bold,
                    upwards,
                }) => {
                    let anchor = match anchor {
                        Anchor::Start => "",
                        Anchor::Middle => r#" text-anchor="middle""#,
                        Anchor::End => r#" text-anchor="end""#,
                    };
                    let fill = if *fill == "black" {
                        String::new()
                    } else {
                        format!(r#" fill="{fill}""#)
                    };
                    let size = if *size == 12.0 {
                        String::new()
                    } else {
                        format!(r#" font-size="{size}""#)
                    };
                    let bold = if *bold { r#" font-weight="bold""# } else { "" };
                    let turn = if *upwards {
                        format!(r#" transform="rotate(-90 {:.1} {:.1})""#, at.0, at.1)
                    } else {
                        String::new()
                    };
                    writeln!(
                        out,
                        r#"<text x="{:.1}" y="{:.1}"{anchor}{fill}{size}{bold}{turn}>{}</text>"#,
                        at.0,
                        at.1,
                        escape(text)
                    )?
                }
            }
        }
        writeln!(out, "</svg>")
    }

    /// The picture as a PNG file's bytes, [`PNG_SCALE`] pixels per unit.
    pub fn png(&self) -> anyhow::Result<Vec<u8>> {
        register_font();
        let s = PNG_SCALE;
        let (w, h) = (
            (self.size.0 * s).ceil() as u32,
            (self.size.1 * s).ceil() as u32,
        );
        let mut rgb = vec![0u8; (w as usize) * (h as usize) * 3];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing a PNG: {e:?}");
            root.fill(&WHITE).map_err(err)?;
            let p = |(x, y): (f64, f64)| ((x * s).round() as i32, (y * s).round() as i32);
            for m in &self.marks {
                match m {
                    Mark::Rect {
                        x, y, w, h, fill, ..
                    } => root
                        .draw(&Rectangle::new(
                            [p((*x, *y)), p((x + w, y + h))],
                            colour(fill)?.filled(),
                        ))
                        .map_err(err)?,
                    Mark::Polygon { points, fill } => root
                        .draw(&Polygon::new(
                            points.iter().map(|q| p(*q)).collect::<Vec<_>>(),
                            colour(fill)?.filled(),
                        ))
                        .map_err(err)?,
                    Mark::Line {
                        from,
                        to,
                        stroke,
                        width,
                        dash,
                    } => {
                        let style = colour(stroke)?.stroke_width((width * s).round() as u32);
                        match dash {
                            None => root
                                .draw(&PathElement::new(vec![p(*from), p(*to)], style))
                                .map_err(err)?,
                            Some((a, b)) => root
                                .draw(&DashedPathElement::new(
                                    vec![p(*from), p(*to)],
                                    (a * s).round() as i32,
                                    (b * s).round() as i32,
                                    style,
                                ))
                                .map_err(err)?,
                        }
                    }
                    Mark::Circle { at, r, fill } => root
                        .draw(&Circle::new(
                            p(*at),
                            (r * s).round() as i32,
                            colour(fill)?.filled(),
                        ))
                        .map_err(err)?,
                    Mark::Text(Text {
                        at,
                        text,
                        anchor,
                        fill,
                        size,
                        bold,
                        upwards,
                    }) => {
                        let h = match anchor {
                            Anchor::Start => HPos::Left,
                            Anchor::Middle => HPos::Center,
                            Anchor::End => HPos::Right,
                        };
                        let face = if *bold {
                            FontStyle::Bold
                        } else {
                            FontStyle::Normal
                        };
                        let c = colour(fill)?;
                        let mut style = TextStyle::from((FAMILY, size * s, face).into_font())
                            .color(&c)
                            .pos(Pos::new(h, VPos::Bottom));
                        if *upwards {
                            style = style.transform(FontTransform::Rotate270);
                        }
                        root.draw(&plotters::element::Text::new(text.clone(), p(*at), style))
                            .map_err(err)?
                    }
                }
            }
            root.present().map_err(err)?;
        }
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
}

/// `#rrggbb` or a named colour as plotters' RGB.
fn colour(c: &str) -> anyhow::Result<RGBColor> {
    Ok(match c {
        "black" => BLACK,
        "white" => WHITE,
        "red" => RGBColor(220, 0, 0),
        _ => {
            let hex = c
                .strip_prefix('#')
                .filter(|h| h.len() == 6)
                .ok_or_else(|| anyhow!("colour {c}: give #rrggbb"))?;
            let byte = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16);
            RGBColor(byte(0)?, byte(2)?, byte(4)?)
        }
    })
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picture() -> Picture {
        let mut p = Picture::new((200.0, 100.0));
        p.push(Mark::Rect {
            x: 10.0,
            y: 10.0,
            w: 50.0,
            h: 40.0,
            fill: "#4e79a7",
            title: Some("a & b".into()),
        });
        p.push(Mark::Polygon {
            points: vec![(100.0, 90.0), (150.0, 20.0), (190.0, 90.0)],
            fill: "#f28e2b",
        });
        p.push(Mark::Line {
            from: (0.0, 95.0),
            to: (200.0, 95.0),
            stroke: "red",
            width: 2.0,
            dash: Some((6.0, 4.0)),
        });
        p.push(Mark::Circle {
            at: (150.0, 20.0),
            r: 4.0,
            fill: "red",
        });
        p.push(Mark::text((10.0, 70.0), "peak <x>"));
        p.push(Text::new((8.0, 50.0), "bytes").upwards().into());
        p
    }

    #[test]
    fn svg_has_every_mark_escaped() {
        let mut s = Vec::new();
        picture().svg(&mut s).unwrap();
        let s = String::from_utf8(s).unwrap();
        assert!(s.contains(r#"<title>a &amp; b</title>"#), "{s}");
        assert!(s.contains(r#"points="100.0,90.0 150.0,20.0 190.0,90.0""#));
        assert!(s.contains(r#"stroke="red" stroke-width="2" stroke-dasharray="6 4""#));
        assert!(s.contains(r#"<circle cx="150.0" cy="20.0" r="4" fill="red"/>"#));
        assert!(s.contains(">peak &lt;x&gt;</text>"));
        // An axis title written upwards: turned about its anchor.
        assert!(
            s.contains(r#"<text x="8.0" y="50.0" transform="rotate(-90 8.0 50.0)">bytes</text>"#),
            "{s}"
        );
        assert!(s.trim_end().ends_with("</svg>"));
    }

    /// The PNG is the picture's size times the scale, and its pixels carry the marks' colours
    /// where they were drawn (the rectangle's blue inside it, white outside every mark).
    #[test]
    fn png_draws_the_marks_where_the_svg_does() {
        let bytes = picture().png().unwrap();
        let img = image::load_from_memory(&bytes).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (400, 200));
        assert_eq!(
            img.get_pixel(60, 40).0,
            [0x4e, 0x79, 0xa7],
            "inside the rect"
        );
        assert_eq!(
            img.get_pixel(300, 150).0,
            [0xf2, 0x8e, 0x2b],
            "inside the triangle"
        );
        assert_eq!(
            img.get_pixel(170, 20).0,
            [255, 255, 255],
            "outside every mark"
        );
        // The text drew something dark near its anchor.
        let dark = (20..120)
            .flat_map(|x| (120..142).map(move |y| (x, y)))
            .filter(|&(x, y)| img.get_pixel(x, y).0[0] < 100)
            .count();
        assert!(dark > 20, "{dark} dark pixels where the text is");
        assert!(colour("#zz0000").is_err());
    }
}
