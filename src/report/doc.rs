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
         body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}\n\
         th, td {{ border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }}\n\
         th {{ background: #eee; }}\n code {{ background: #f4f4f4; padding: 0 0.2em; }}\n\
         figure {{ margin: 1.5em 0; }} figure svg {{ max-width: 100%; height: auto; }}\n\
         .strip span {{ display: inline-block; min-width: 2.4em; margin: 0 2px 2px 0; padding: 0.3em 0.2em; text-align: center; font-weight: bold; border-radius: 3px; }}\n\
         .expandable summary {{ cursor: pointer; }} .expandable dt {{ font-weight: bold; margin-top: 0.4em; }} .expandable dd {{ margin-left: 1em; }}\n\
         .legend {{ font-size: 0.85em; margin-bottom: 1em; }} .legend span {{ display: inline-block; width: 1em; margin-left: 0.6em; }}\n\
         .glance {{ display: flex; flex-wrap: wrap; gap: 1em; }} .glance figure {{ flex: 1 1 480px; margin: 0.5em 0; }}\n\
         </style>\n</head>\n<body>\n",
        escape(title)
    );
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
                out.push_str("<table>\n<tr>");
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
                out.push_str("</table>\n");
                if collapse {
                    out.push_str("</details>\n");
                }
            }
            Block::Plot { name, caption } => out.push_str(&figure(name, caption, svg)),
            Block::Expandable(head, rows) => {
                out.push_str("<table class=\"expandable\">\n<tr>");
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
                out.push_str("</table>\n");
            }
            Block::Glance(plots) => {
                out.push_str("<div class=\"glance\">\n");
                for (name, caption) in plots {
                    out.push_str(&figure(name, caption, svg));
                }
                out.push_str("</div>\n");
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
    out.push_str("</body>\n</html>\n");
    out
}

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
                && h.contains("</table>\n</details>")
        );
        assert!(!markdown(&long).contains("details"));
        let open = [Block::OpenTable(vec!["n".into()], rows)];
        assert!(!html("t", &open, &|_| None).contains("<details>"));
    }
}
