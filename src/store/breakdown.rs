//! The picture of `memfit predict --plot FILE.svg|png`: per case, a stacked bar per phase (train
//! step, inference, prefill, decode) split by component ([`crate::formula::breakdown`]), each
//! bar's total above it, and the budget (`--fit-in`) as a red line — the picture a person sizing
//! a GPU wants. One scale for every case, so the cases compare at a glance.

use super::picture::{Anchor, Mark, Picture, Text};
use super::timeline::{head, human, legend, y_ticks};

/// The components' colours, in [`crate::formula::breakdown::COMPONENTS`] order.
const COLOURS: [&str; 7] = [
    "#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#76b7b2", "#edc948", "#bab0ac",
];

/// One case's bars: its label and, per phase, the bytes per component.
pub struct Group<'a> {
    pub label: String,
    pub bars: Vec<(&'a str, [u64; 7])>,
}

/// The bars of `groups` (components named by `names`) with the `budget` line when given.
pub fn picture(title: &str, names: &[&str; 7], groups: &[Group], budget: Option<u64>) -> Picture {
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
    let mut p = head((w, h), left, 24.0, title);
    y_ticks(&mut p, ymax, left, left + plot_w, &y);
    let small = |at: (f64, f64), text: String| -> Mark {
        Text::new(at, text).anchor(Anchor::Middle).size(10.0).into()
    };
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
                p.push(Mark::Rect {
                    x,
                    y: y1,
                    w: bar_w,
                    h: (y0 - y1).max(0.0),
                    fill: COLOURS[c],
                    title: Some(format!("{phase} {}: {}", names[c], human(part))),
                });
                below += part;
            }
            p.push(small(
                (x + bar_w / 2.0, y(below as f64) - 4.0),
                human(below),
            ));
            p.push(small((x + bar_w / 2.0, top + ph + 14.0), phase.to_string()));
            x += bar_w + gap;
        }
        p.push(
            Text::new(((start + x - gap) / 2.0, top + ph + 32.0), g.label.clone())
                .anchor(Anchor::Middle)
                .bold()
                .into(),
        );
        x += group_gap;
    }
    p.push(Mark::line(
        (left, top + ph),
        (left + plot_w, top + ph),
        "black",
    ));
    p.push(Mark::line((left, top), (left, top + ph), "black"));
    if let Some(b) = budget {
        p.push(Mark::Line {
            from: (left, y(b as f64)),
            to: (left + plot_w, y(b as f64)),
            stroke: "red",
            width: 2.0,
            dash: Some((6.0, 4.0)),
        });
        p.push(
            Text::new(
                (left + plot_w, y(b as f64) - 5.0),
                format!("budget {}", human(b)),
            )
            .anchor(Anchor::End)
            .fill("red")
            .into(),
        );
    }
    for (c, (name, colour)) in names.iter().zip(COLOURS).enumerate() {
        let lx = left + (c % 4) as f64 * 150.0;
        let ly = h - 44.0 + (c / 4) as f64 * 18.0;
        legend(&mut p, (lx, ly), colour, name);
    }
    p
}
