//! `memfit convert DIR`: derive `results.csv` and `results.h5` from a run folder's journal and
//! `meta.json`, as `memfit run` does at its end.

use anyhow::Context;

use crate::cli::ConvertArgs;
use crate::error::UserError;
use crate::record::RunMeta;
use crate::store;

pub fn convert(args: &ConvertArgs) -> anyhow::Result<()> {
    let journal = args.dir.join("results.jsonl");
    let meta_path = args.dir.join("meta.json");
    for p in [&journal, &meta_path] {
        if !p.is_file() {
            return Err(UserError::Unreadable {
                origin: p.display().to_string(),
                what: "run folder",
                message: "not found: a run folder holds results.jsonl and meta.json".into(),
            }
            .into());
        }
    }
    let text = std::fs::read_to_string(&meta_path)
        .with_context(|| format!("reading {}", meta_path.display()))?;
    let meta: RunMeta =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", meta_path.display()))?;
    let rows = store::jsonl::read(&journal)?;
    store::csv::write(&args.dir.join("results.csv"), &rows)?;
    store::hdf5::write(&args.dir.join("results.h5"), &meta, &rows)?;
    println!(
        "wrote {} row(s): {}, {}",
        rows.len(),
        args.dir.join("results.csv").display(),
        args.dir.join("results.h5").display()
    );
    Ok(())
}
