//! Every workload file in `workloads/` reads and expands (the GPU ones only in a `cuda` build;
//! a CPU build must refuse them with the hint to build the CUDA binary).

use memfit::workload::{self, GridSpec};

#[test]
fn every_workload_file_expands() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
    // dataload grids need an existing dataset: a tiny one, given as a flag (model grids ignore
    // the data keys, so the flag changes nothing there).
    let data = tempfile::tempdir().unwrap();
    memfit::data::dataset::make(
        data.path(),
        &memfit::data::dataset::Spec {
            seed: 0,
            count: 2,
            min_px: 8,
            max_px: 8,
            formats: vec![memfit::data::dataset::Format::Png],
        },
    )
    .unwrap();
    let flags = GridSpec {
        dataset: Some(data.path().display().to_string()),
        ..GridSpec::default()
    };
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        seen += 1;
        let file = workload::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let origin = path.display().to_string();
        let gpu = file
            .defaults
            .device
            .as_deref()
            .is_some_and(|d| d.starts_with("cuda"));
        // Every file's cases must be valid as predictions, GPU ones included.
        let predicted = workload::expand_for_prediction(&file, &flags, &origin)
            .unwrap_or_else(|e| panic!("{origin}: {e}"));
        assert!(!predicted.is_empty(), "{origin}");
        let with_flags = workload::expand(&file, &flags, &origin);
        if with_flags
            .as_ref()
            .is_ok_and(|c| c.iter().all(|c| c.data.is_none()))
        {
            assert_eq!(
                workload::expand(&file, &GridSpec::default(), &origin).ok(),
                with_flags.as_ref().ok().cloned(),
                "{origin}: the dataset flag must not change a model workload"
            );
        }
        match workload::expand(&file, &flags, &origin) {
            Ok(cases) => {
                assert!(!cases.is_empty(), "{origin}");
                assert!(
                    !gpu || cfg!(feature = "cuda"),
                    "{origin} expanded without cuda"
                );
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    gpu && !cfg!(feature = "cuda") && msg.contains("scripts/build-cuda.sh"),
                    "{origin}: {msg}"
                );
            }
        }
    }
    assert!(seen >= 2, "default and gpu workloads");
}

/// The GPU sweep's shape: every phase, three element types, one case above 60 GB of
/// activations (gpt2-small f32 B 8 × S 1024) and one that cannot fit in 141 GB.
#[test]
fn gpu_sweep_spans_the_promised_range() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/gpu-h200.toml"),
    )
    .unwrap();
    let file = workload::parse(&text, "gpu-h200.toml").unwrap();
    // Expand as if on the CPU build's terms, device aside, to look at the shapes.
    let mut cpu = file.clone();
    cpu.defaults.device = Some("cpu".into());
    for g in &mut cpu.grid {
        g.dtype = Some(workload::OneOrMany::One("f32".into()));
        g.precision = None;
    }
    let cases = workload::expand(&cpu, &GridSpec::default(), "gpu-h200.toml").unwrap();
    let act =
        |c: &workload::Case| memfit::formula::transformer::Shape::of(c).activation_data_bytes();
    let max = cases.iter().map(act).max().unwrap();
    assert!(max > 141_000_000_000, "a case beyond the H200: {max}");
    assert!(
        cases
            .iter()
            .map(act)
            .any(|a| (45_000_000_000..141_000_000_000).contains(&a)),
        "a case of tens of GB"
    );
    let dtypes: std::collections::BTreeSet<_> = file
        .grid
        .iter()
        .flat_map(|g| g.dtype.clone().map(|d| d.to_vec()).unwrap_or_default())
        .collect();
    assert_eq!(dtypes.len(), 3, "{dtypes:?}");
}
