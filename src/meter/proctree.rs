//! Process-tree memory: RSS and PSS summed over a process and all its descendants, from
//! `/proc/<pid>/smaps_rollup`, sampled on a thread.
//!
//! - RSS of a process counts every resident page it maps, so a page shared by k processes (the
//!   page cache behind a memory map, shared libraries) is counted k times in the tree's sum.
//! - PSS divides each page among the processes that map it (`Pss = Σ page / sharers`), so the
//!   tree's PSS sum counts a page shared inside the tree once: `Σ PSS` is the tree's own
//!   footprint. Pages shared with processes outside the tree contribute their fraction.
//!
//! The tree is found by scanning `/proc/*/stat` for parent pids (no `CONFIG_PROC_CHILDREN`
//! needed). A process that exits between the scan and the read is skipped. Steady figures are
//! the means of the samples taken in the window's second half.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Resident and proportional bytes of one process or a sum of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mem {
    pub rss_bytes: u64,
    pub pss_bytes: u64,
}

/// `Rss:` and `Pss:` of an `smaps_rollup` text (kB in the file, bytes out).
pub fn parse_rollup(text: &str) -> Option<Mem> {
    let field = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let kb: u64 = line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    Some(Mem {
        rss_bytes: field("Rss:")?,
        pss_bytes: field("Pss:")?,
    })
}

/// The parent pid in a `/proc/<pid>/stat` line (the field after the `)` that ends the name).
pub fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let _state = it.next()?;
    it.next()?.parse().ok()
}

/// `root` and every descendant, from `(pid, ppid)` pairs (root first).
pub fn tree_of(root: u32, pairs: &[(u32, u32)]) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for &(pid, ppid) in pairs {
            if ppid == parent && !tree.contains(&pid) {
                tree.push(pid);
            }
        }
        i += 1;
    }
    tree
}

/// Every live process's `(pid, ppid)`.
fn all_parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some((pid, parse_ppid(&stat)?))
    })
    .collect()
}

/// The memory of one process, if it is still there and readable.
pub fn process_mem(pid: u32) -> Option<Mem> {
    parse_rollup(&std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?)
}

/// The tree's memory summed over its processes, and how many were read.
pub fn tree_mem(root: u32) -> (Mem, usize) {
    let mut sum = Mem::default();
    let mut n = 0;
    for pid in tree_of(root, &all_parents()) {
        if let Some(m) = process_mem(pid) {
            sum.rss_bytes += m.rss_bytes;
            sum.pss_bytes += m.pss_bytes;
            n += 1;
        }
    }
    (sum, n)
}

/// What a sampler saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeStats {
    pub rss_peak_bytes: u64,
    pub pss_peak_bytes: u64,
    pub rss_steady_bytes: u64,
    pub pss_steady_bytes: u64,
    /// Most processes in one sample.
    pub processes_max: u64,
    pub samples: u64,
}

/// Samples the tree of `root` every `interval` until stopped.
pub struct TreeSampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<(f64, Mem, usize)>>,
    t0: Instant,
}

impl TreeSampler {
    pub fn start(root: u32, interval: Duration) -> anyhow::Result<TreeSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let t0 = Instant::now();
        let handle = std::thread::Builder::new()
            .name("proctree-sampler".into())
            .spawn(move || {
                let mut samples = Vec::with_capacity(4096);
                loop {
                    let (m, n) = tree_mem(root);
                    samples.push((t0.elapsed().as_secs_f64(), m, n));
                    if flag.load(Ordering::Relaxed) {
                        return samples;
                    }
                    std::thread::sleep(interval);
                }
            })?;
        Ok(TreeSampler { stop, handle, t0 })
    }

    /// Stops (after one last sample) and summarises.
    pub fn stop(self) -> anyhow::Result<TreeStats> {
        let end = self.t0.elapsed().as_secs_f64();
        self.stop.store(true, Ordering::Relaxed);
        let samples = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("the process-tree sampler panicked"))?;
        Ok(summarise(&samples, end))
    }
}

/// Peaks over all samples; steady = means over the samples at `t ≥ end / 2`.
pub fn summarise(samples: &[(f64, Mem, usize)], end: f64) -> TreeStats {
    let mut s = TreeStats {
        samples: samples.len() as u64,
        ..TreeStats::default()
    };
    let (mut rss, mut pss, mut k) = (0u128, 0u128, 0u128);
    for &(t, m, n) in samples {
        s.rss_peak_bytes = s.rss_peak_bytes.max(m.rss_bytes);
        s.pss_peak_bytes = s.pss_peak_bytes.max(m.pss_bytes);
        s.processes_max = s.processes_max.max(n as u64);
        if t >= end / 2.0 {
            rss += m.rss_bytes as u128;
            pss += m.pss_bytes as u128;
            k += 1;
        }
    }
    s.rss_steady_bytes = rss.checked_div(k).unwrap_or(0) as u64;
    s.pss_steady_bytes = pss.checked_div(k).unwrap_or(0) as u64;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollup_and_stat_parse() {
        let text = "00400000-7ffd [rollup]\nRss:              2048 kB\nPss:               1536 kB\n\
                    Pss_Anon:           512 kB\nShared_Clean:      1024 kB\n";
        assert_eq!(
            parse_rollup(text),
            Some(Mem {
                rss_bytes: 2048 * 1024,
                pss_bytes: 1536 * 1024
            })
        );
        assert_eq!(parse_rollup("Rss: 1 kB\n"), None);
        assert_eq!(
            parse_ppid("123 (a b) c) S 77 123 123 0 -1"),
            Some(77),
            "names may hold spaces and parentheses"
        );
    }

    #[test]
    fn trees_follow_parents() {
        let pairs = [
            (1, 0),
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 11),
            (20, 1),
            (21, 99),
        ];
        let mut t = tree_of(10, &pairs);
        t.sort();
        assert_eq!(t, vec![10, 11, 12, 13]);
        assert_eq!(tree_of(21, &pairs), vec![21]);
    }

    #[test]
    fn summary_peaks_and_steady_means() {
        let m = |r, p| Mem {
            rss_bytes: r,
            pss_bytes: p,
        };
        let samples = [
            (0.0, m(100, 50), 1),
            (1.0, m(900, 400), 3),
            (2.0, m(300, 200), 2),
            (3.0, m(500, 300), 2),
        ];
        let s = summarise(&samples, 4.0);
        assert_eq!((s.rss_peak_bytes, s.pss_peak_bytes), (900, 400));
        assert_eq!((s.rss_steady_bytes, s.pss_steady_bytes), (400, 250));
        assert_eq!((s.processes_max, s.samples), (3, 4));
    }

    #[test]
    fn this_process_is_read() {
        let (m, n) = tree_mem(std::process::id());
        assert!(n >= 1);
        assert!(m.rss_bytes > 0 && m.pss_bytes > 0 && m.pss_bytes <= m.rss_bytes);
    }
}
