//! A small document model for the report, rendered two ways: Markdown (plots linked as files)
//! and a self-contained HTML page (plots inlined as SVG). Pure functions, no I/O.

/// A row of [`Block::Expandable`]: its shown cells and its `(field, text)` details.
pub type ExpandableRow = (Vec<String>, Vec<(String, String)>);

/// One block of the report.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Heading(u8, String),
    Para(String),
    /// Header cells and rows of cells (plain text; `|` is escaped in Markdown). In HTML a
    /// table of more than [`COLLAPSE_ROWS`] rows is collapsed under a line saying its size.
    Table(Vec<String>, Vec<Vec<String>>),
    /// A table the reader came for (the claims): never collapsed.
    OpenTable(Vec<String>, Vec<Vec<String>>),
    /// A plot: its file stem (`NAME.svg`, `NAME.png` beside the report) and a caption.
    Plot {
        name: String,
        caption: String,
    },
    /// A table whose last shown column opens onto more fields (the claims: the verdict opens
    /// onto its criterion and figures): header of the shown columns, then per row its shown
    /// cells and its `(field, text)` details. In Markdown every field is a column.
    Expandable(Vec<String>, Vec<ExpandableRow>),
    /// Plots side by side (the report's first screen): `(name, caption)` as [`Block::Plot`].
    Glance(Vec<(String, String)>),
    /// A strip of labelled cells coloured by kind (the claims' verdicts): `(label, kind)`;
    /// `legend` names each kind with its colour. In Markdown one line of `label kind` pairs.
    Strip {
        cells: Vec<(String, String)>,
        legend: Vec<(String, String)>,
    },
    /// A memory timeline from its trace file (`file`, Chrome/Perfetto trace events): in HTML
    /// the trace is embedded and drawn by the page's script ([`TIMELINE_SCRIPT`]) when given
    /// (None: too large to carry; named only). In Markdown the caption and the file.
    Timeline {
        file: String,
        caption: String,
        trace: Option<String>,
    },
}

/// Tables longer than this are collapsed (`<details>`) in the HTML.
pub const COLLAPSE_ROWS: usize = 12;

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Markdown: tables as GitHub pipe tables, plots as PNG images linking to the SVG.
pub fn markdown(blocks: &[Block]) -> String {
    let mut out = String::new();
    for b in blocks {
        match b {
            Block::Heading(level, t) => {
                out.push_str(&format!("{} {t}\n\n", "#".repeat(*level as usize)))
            }
            Block::Para(t) => out.push_str(&format!("{t}\n\n")),
            Block::Table(head, rows) | Block::OpenTable(head, rows) => {
                let line = |cells: &[String]| {
                    format!(
                        "| {} |\n",
                        cells.iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | ")
                    )
                };
                out.push_str(&line(head));
                out.push_str(&format!("|{}\n", "---|".repeat(head.len())));
                for r in rows {
                    out.push_str(&line(r));
                }
                out.push('\n');
            }
            Block::Plot { name, caption } => out.push_str(&format!(
                "[![{caption}]({name}.png)]({name}.svg)\n\n*{caption}* ([SVG]({name}.svg), [PNG]({name}.png))\n\n"
            )),
            Block::Expandable(head, rows) => {
                let mut full = head.clone();
                if let Some((_, details)) = rows.first() {
                    full.extend(details.iter().map(|(f, _)| f.clone()));
                }
                let rows: Vec<Vec<String>> = rows
                    .iter()
                    .map(|(cells, details)| {
                        let mut r = cells.clone();
                        r.extend(details.iter().map(|(_, t)| t.clone()));
                        r
                    })
                    .collect();
                out.push_str(&markdown(&[Block::OpenTable(full, rows)]));
            }
            Block::Glance(plots) => {
                for (name, caption) in plots {
                    out.push_str(&format!(
                        "[![{caption}]({name}.png)]({name}.svg)\n\n*{caption}* ([SVG]({name}.svg), [PNG]({name}.png))\n\n"
                    ));
                }
            }
            Block::Timeline { file, caption, .. } => out.push_str(&format!(
                "{caption}: `{file}` (Chrome/Perfetto trace events: open it in ui.perfetto.dev or chrome://tracing)\n\n"
            )),
            Block::Strip { cells, .. } => {
                let parts: Vec<String> = cells
                    .iter()
                    .map(|(label, kind)| format!("**{label}** {kind}"))
                    .collect();
                out.push_str(&format!("{}\n\n", parts.join(" · ")));
            }
        }
    }
    out
}

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Inline Markdown used in paragraphs and cells: `code` spans and **bold** outside them.
fn inline(s: &str) -> String {
    let e = escape(s);
    let mut out = String::new();
    for (i, part) in e.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str(&format!("<code>{part}</code>"));
        } else {
            for (j, text) in part.split("**").enumerate() {
                if j % 2 == 1 {
                    out.push_str(&format!("<strong>{text}</strong>"));
                } else {
                    out.push_str(text);
                }
            }
        }
    }
    out
}

/// A self-contained HTML page: `svg(name)` returns the plot's SVG text, inlined as is.
pub fn html(title: &str, blocks: &[Block], svg: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n\
         body {{ font-family: sans-serif; max-width: 1240px; margin: 2em auto; padding: 0 1em; color: #222; overflow-wrap: anywhere; }}\n\
         .wide {{ max-width: 100%; overflow-x: auto; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}\n\
         th, td {{ border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: left; vertical-align: top; overflow-wrap: normal; }}\n\
         th {{ background: #eee; }}\n code {{ background: #f4f4f4; padding: 0 0.2em; }}\n\
         figure {{ margin: 1.5em 0; }} figure svg, img {{ max-width: 100%; height: auto; }}\n\
         .strip span {{ display: inline-block; min-width: 2.4em; margin: 0 2px 2px 0; padding: 0.3em 0.2em; text-align: center; font-weight: bold; border-radius: 3px; }}\n\
         .expandable summary {{ cursor: pointer; }} .expandable dt {{ font-weight: bold; margin-top: 0.4em; }} .expandable dd {{ margin-left: 1em; }}\n\
         .legend {{ font-size: 0.85em; margin-bottom: 1em; }} .legend span {{ display: inline-block; width: 1em; margin-left: 0.6em; }}\n\
         .glance {{ display: flex; flex-wrap: wrap; gap: 1em; }} .glance figure {{ flex: 1 1 480px; margin: 0.5em 0; }}\n\
         </style>\n</head>\n<body>\n",
        escape(title)
    );
    let mut timelines = 0;
    for b in blocks {
        match b {
            Block::Heading(level, t) => {
                out.push_str(&format!("<h{level}>{}</h{level}>\n", inline(t)))
            }
            Block::Para(t) => out.push_str(&format!("<p>{}</p>\n", inline(t))),
            Block::Table(head, rows) | Block::OpenTable(head, rows) => {
                let collapse = matches!(b, Block::Table(..)) && rows.len() > COLLAPSE_ROWS;
                if collapse {
                    out.push_str(&format!(
                        "<details>\n<summary>{} rows ({})</summary>\n",
                        rows.len(),
                        inline(head.first().map_or("", |h| h.as_str()))
                    ));
                }
                out.push_str("<div class=\"wide\"><table>\n<tr>");
                for h in head {
                    out.push_str(&format!("<th>{}</th>", inline(h)));
                }
                out.push_str("</tr>\n");
                for r in rows {
                    out.push_str("<tr>");
                    for c in r {
                        out.push_str(&format!("<td>{}</td>", inline(c)));
                    }
                    out.push_str("</tr>\n");
                }
                out.push_str("</table></div>\n");
                if collapse {
                    out.push_str("</details>\n");
                }
            }
            Block::Plot { name, caption } => out.push_str(&figure(name, caption, svg)),
            Block::Expandable(head, rows) => {
                out.push_str("<div class=\"wide\"><table class=\"expandable\">\n<tr>");
                for h in head {
                    out.push_str(&format!("<th>{}</th>", inline(h)));
                }
                out.push_str("</tr>\n");
                for (cells, details) in rows {
                    out.push_str("<tr>");
                    let last = cells.len().saturating_sub(1);
                    for (i, c) in cells.iter().enumerate() {
                        if i < last || details.is_empty() {
                            out.push_str(&format!("<td>{}</td>", inline(c)));
                            continue;
                        }
                        out.push_str(&format!(
                            "<td><details><summary>{}</summary>\n<dl>",
                            inline(c)
                        ));
                        for (field, text) in details {
                            out.push_str(&format!(
                                "<dt>{}</dt><dd>{}</dd>",
                                inline(field),
                                inline(text)
                            ));
                        }
                        out.push_str("</dl></details></td>");
                    }
                    out.push_str("</tr>\n");
                }
                out.push_str("</table></div>\n");
            }
            Block::Glance(plots) => {
                out.push_str("<div class=\"glance\">\n");
                for (name, caption) in plots {
                    out.push_str(&figure(name, caption, svg));
                }
                out.push_str("</div>\n");
            }
            Block::Timeline {
                file,
                caption,
                trace,
            } => {
                timelines += 1;
                out.push_str(&format!(
                    "<figure class=\"timeline\" data-file=\"{}\">\n",
                    escape(file)
                ));
                match trace {
                    Some(t) => out.push_str(&format!(
                        "<svg class=\"timeline\" width=\"960\" height=\"360\" viewBox=\"0 0 960 360\"></svg>\n<script type=\"application/json\" class=\"trace\">{}</script>\n",
                        // `</` cannot end the script early once written `<\/` (the same JSON).
                        t.replace("</", "<\\/")
                    )),
                    None => out.push_str("<p>(too large to draw here: open the file in ui.perfetto.dev)</p>\n"),
                }
                out.push_str(&format!(
                    "<figcaption>{}: <code>{}</code> (open it in ui.perfetto.dev or chrome://tracing)</figcaption>\n</figure>\n",
                    inline(caption),
                    escape(file)
                ));
            }
            Block::Strip { cells, legend } => {
                let colour = |kind: &str| {
                    legend
                        .iter()
                        .find(|(k, _)| k == kind)
                        .map_or("#ccc", |(_, c)| c.as_str())
                        .to_string()
                };
                out.push_str("<div class=\"strip\">");
                for (label, kind) in cells {
                    out.push_str(&format!(
                        "<span style=\"background:{}\" title=\"{}: {}\">{}</span>",
                        colour(kind),
                        escape(label),
                        escape(kind),
                        escape(label)
                    ));
                }
                out.push_str("</div>\n<div class=\"legend\">");
                for (kind, c) in legend {
                    out.push_str(&format!(
                        "<span style=\"background:{c}\">&nbsp;</span> {} ",
                        escape(kind)
                    ));
                }
                out.push_str("</div>\n");
            }
        }
    }
    if timelines > 0 {
        out.push_str(TIMELINE_SCRIPT);
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// Draws each `figure.timeline` from its embedded trace (the first process's stacked `bytes`
/// counter: one column per event, the categories in the trace's order, the peak marked) and
/// notes on the figure what it drew: `data-events` (counter events), `data-peak` (the largest
/// stacked total) and `data-categories`.
pub const TIMELINE_SCRIPT: &str = r#"<script>
(() => {
  const NS = 'http://www.w3.org/2000/svg';
  const COLOURS = ['#76b7b2', '#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#bab0ac'];
  const human = b => b >= 2 ** 30 ? (b / 2 ** 30).toFixed(2) + ' GiB' : b >= 2 ** 20 ? (b / 2 ** 20).toFixed(2) + ' MiB' : b >= 1024 ? (b / 1024).toFixed(2) + ' KiB' : b + ' B';
  const el = (svg, name, attrs, text) => { const e = document.createElementNS(NS, name); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; svg.appendChild(e); return e; };
  for (const fig of document.querySelectorAll('figure.timeline')) {
    const src = fig.querySelector('script.trace');
    const svg = fig.querySelector('svg.timeline');
    if (!src || !svg) continue;
    const trace = JSON.parse(src.textContent);
    const events = trace.traceEvents.filter(e => e.ph === 'C' && e.name === 'bytes' && e.pid === 1);
    if (events.length === 0) continue;
    const ORDER = ['kv cache', 'activations', 'temporaries', 'gradients', 'workspace', 'bookkeeping'];
    const keys = Object.keys(events[0].args);
    const cats = ORDER.filter(c => keys.includes(c)).concat(keys.filter(c => !ORDER.includes(c)));
    const totals = events.map(e => cats.reduce((s, c) => s + (e.args[c] || 0), 0));
    const peak = Math.max(...totals), at = totals.indexOf(peak);
    const [w, h, left, top, bottom] = [960, 360, 104, 20, 50];
    const pw = w - left - 20, ph = h - top - bottom, ymax = Math.max(peak, 1) * 1.1;
    const x = i => left + pw * i / events.length, y = b => top + ph * (1 - b / ymax);
    el(svg, 'rect', { width: w, height: h, fill: 'white' });
    let below = events.map(() => 0);
    cats.forEach((c, k) => {
      const above = events.map((e, i) => below[i] + (e.args[c] || 0));
      const pts = above.flatMap((a, i) => [x(i) + ',' + y(a), x(i + 1) + ',' + y(a)]).concat(below.map((b, i) => [x(i + 1) + ',' + y(b), x(i) + ',' + y(b)]).reverse().flat());
      el(svg, 'polygon', { points: pts.join(' '), fill: COLOURS[k % COLOURS.length] });
      el(svg, 'rect', { x: left + k * 130, y: h - 22, width: 12, height: 12, fill: COLOURS[k % COLOURS.length] });
      el(svg, 'text', { x: left + k * 130 + 16, y: h - 12, 'font-size': 12 }, c);
      below = above;
    });
    el(svg, 'line', { x1: left, y1: top + ph, x2: left + pw, y2: top + ph, stroke: 'black' });
    el(svg, 'line', { x1: left, y1: top, x2: left, y2: top + ph, stroke: 'black' });
    for (let k = 0; k <= 4; k++) el(svg, 'text', { x: left - 6, y: y(ymax * k / 4) + 4, 'text-anchor': 'end', 'font-size': 12 }, human(Math.round(ymax * k / 4)));
    el(svg, 'text', { x: 16, y: top + ph / 2, 'text-anchor': 'middle', 'font-size': 12, fill: '#555', transform: `rotate(-90 16 ${top + ph / 2})` }, "memory held above the window's start");
    el(svg, 'text', { x: left + pw, y: top + ph + 16, 'text-anchor': 'end', 'font-size': 12, fill: '#555' }, 'allocator events →');
    for (const s of trace.traceEvents.filter(e => e.ph === 'i' && e.pid === 1 && !e.name.startsWith('peak'))) {
      el(svg, 'line', { x1: x(s.ts), y1: top, x2: x(s.ts), y2: top + ph, stroke: '#555', 'stroke-dasharray': '4 3' });
      el(svg, 'text', { x: x(s.ts) + 3, y: top + 12, fill: '#555', 'font-size': 12 }, s.name);
    }
    el(svg, 'circle', { cx: x(at), cy: y(peak), r: 4, fill: 'red' });
    el(svg, 'text', { x: x(at) > left + pw * 0.4 ? x(at) - 8 : x(at) + 8, y: y(peak) - 6, fill: 'red', 'text-anchor': x(at) > left + pw * 0.4 ? 'end' : 'start', 'font-size': 12 }, 'peak ' + human(peak));
    fig.dataset.events = events.length;
    fig.dataset.peak = peak;
    fig.dataset.categories = cats.join(',');
  }
})();
</script>
"#;

/// A plot as an HTML figure: its SVG inline (the XML declaration dropped) and its caption.
fn figure(name: &str, caption: &str, svg: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::from("<figure>\n");
    match svg(name) {
        Some(s) => {
            let body = s.find("<svg").map_or(s.as_str(), |i| &s[i..]);
            out.push_str(body);
        }
        None => out.push_str(&format!("<p>(plot {} missing)</p>", escape(name))),
    }
    out.push_str(&format!(
        "\n<figcaption>{}</figcaption>\n</figure>\n",
        inline(caption)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_renderings() {
        let blocks = vec![
            Block::Heading(1, "memfit report".into()),
            Block::Para("peak of `train-step` a<b".into()),
            Block::Table(
                vec!["phase".into(), "bytes".into()],
                vec![vec!["forward".into(), "1|2".into()]],
            ),
            Block::Plot {
                name: "p".into(),
                caption: "cap".into(),
            },
        ];
        let md = markdown(&blocks);
        assert!(md.starts_with("# memfit report\n\n"));
        assert!(md.contains("| phase | bytes |\n|---|---|\n| forward | 1\\|2 |\n"));
        assert!(md.contains("(p.png)](p.svg)"));
        let h = html("t", &blocks, &|n| {
            (n == "p").then(|| "<?xml version=\"1.0\"?><svg>x</svg>".to_string())
        });
        assert!(h.contains("<p>peak of <code>train-step</code> a&lt;b</p>"));
        assert!(h.contains("<figure>\n<svg>x</svg>") && !h.contains("<?xml"));
        assert!(h.contains("<td>1|2</td>"));
        assert!(!h.contains("<details>"));
        // A long table collapses in HTML (not in Markdown); an open one never does.
        let rows: Vec<Vec<String>> = (0..=COLLAPSE_ROWS).map(|i| vec![i.to_string()]).collect();
        let long = [Block::Table(vec!["n".into()], rows.clone())];
        let h = html("t", &long, &|_| None);
        assert!(
            h.contains("<details>\n<summary>13 rows (n)</summary>")
                && h.contains("</table></div>\n</details>")
        );
        assert!(!markdown(&long).contains("details"));
        let open = [Block::OpenTable(vec!["n".into()], rows)];
        assert!(!html("t", &open, &|_| None).contains("<details>"));
    }
}
