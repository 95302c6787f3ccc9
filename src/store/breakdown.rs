//! The picture of `memfit predict --plot FILE.svg`: per case, a stacked bar per phase (train
//! step, inference, prefill, decode) split by component ([`crate::formula::breakdown`]), each
//! bar's total above it, and the budget (`--fit-in`) as a red line — the picture a person sizing
//! a GPU wants. One scale for every case, so the cases compare at a glance.

use std::io::Write;

use super::timeline::{escape, human, svg_head, y_ticks};

/// The components' colours, in [`crate::formula::breakdown::COMPONENTS`] order.
const COLOURS: [&str; 7] = [
    "#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#76b7b2", "#edc948", "#bab0ac",
];

/// One case's bars: its label and, per phase, the bytes per component.
pub struct Group<'a> {
    pub label: String,
    pub bars: Vec<(&'a str, [u64; 7])>,
}

/// Writes the bars of `groups` (components named by `names`) with the `budget` line when given.
pub fn write_svg(
    out: &mut impl Write,
    title: &str,
    names: &[&str; 7],
    groups: &[Group],
    budget: Option<u64>,
) -> std::io::Result<()> {
    let bars: usize = groups.iter().map(|g| g.bars.len()).sum();
    let (bar_w, gap, group_gap) = (46.0, 10.0, 36.0);
    let (left, top, bottom) = (90.0, 48.0, 110.0);
    let plot_w: f64 = groups
        .iter()
        .map(|g| g.bars.len() as f64 * (bar_w + gap) + group_gap)
        .sum::<f64>()
        .max(bar_w * bars.max(1) as f64);
    let (w, h) = ((left + plot_w + 20.0).max(760.0), 440.0);
    let ph = h - top - bottom;
    let tallest = groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|(_, b)| b.iter().sum::<u64>()))
        .chain(budget)
        .max()
        .unwrap_or(1)
        .max(1);
    let ymax = tallest as f64 * 1.12;
    let y = |b: f64| top + ph * (1.0 - b / ymax);
    svg_head(out, (w, h), left, 24.0, title)?;
    y_ticks(out, ymax, left, left + plot_w, &y)?;
    let mut x = left + group_gap / 2.0;
    for g in groups {
        let start = x;
        for (phase, bytes) in &g.bars {
            let mut below = 0u64;
            for (c, &part) in bytes.iter().enumerate() {
                if part == 0 {
                    continue;
                }
                let (y0, y1) = (y(below as f64), y((below + part) as f64));
                writeln!(
                    out,
                    r#"<rect x="{x:.1}" y="{y1:.1}" width="{bar_w}" height="{:.1}" fill="{}"><title>{} {}: {}</title></rect>"#,
                    (y0 - y1).max(0.0),
                    COLOURS[c],
                    escape(phase),
                    names[c],
                    human(part)
                )?;
                below += part;
            }
            writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                x + bar_w / 2.0,
                y(below as f64) - 4.0,
                human(below)
            )?;
            writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                x + bar_w / 2.0,
                top + ph + 14.0,
                escape(phase)
            )?;
            x += bar_w + gap;
        }
        writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            (start + x - gap) / 2.0,
            top + ph + 32.0,
            escape(&g.label)
        )?;
        x += group_gap;
    }
    writeln!(
        out,
        r#"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{0:.1}" stroke="black"/>"#,
        top + ph,
        left + plot_w
    )?;
    if let Some(b) = budget {
        writeln!(
            out,
            r#"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="red" stroke-width="2" stroke-dasharray="6 4"/><text x="{1:.1}" y="{2:.1}" text-anchor="end" fill="red">budget {3}</text>"#,
            y(b as f64),
            left + plot_w,
            y(b as f64) - 5.0,
            human(b)
        )?;
    }
    for (c, (name, colour)) in names.iter().zip(COLOURS).enumerate() {
        let lx = left + (c % 4) as f64 * 150.0;
        let ly = h - 44.0 + (c / 4) as f64 * 18.0;
        writeln!(
            out,
            r#"<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            lx + 16.0,
            ly + 10.0
        )?;
    }
    writeln!(out, "</svg>")
}
