//! Workers: the main thread (0 workers), N threads, or N worker processes, each making whole
//! batches with its own [`Pipeline`]; the main thread consumes them in order.
//!
//! Dispatch follows PyTorch's `DataLoader`: batch `k` of an epoch goes to worker `k mod N`; at
//! most `prefetch × N` batches are requested and not yet consumed; a new one is requested each
//! time the main thread consumes one. Batches that arrive early wait (in memory) until their
//! turn. Non-persistent workers are started at each epoch's beginning and stopped at its end.
//!
//! Threads share the process's opened dataset (`ram`: one copy; `mmap`: one map). A worker
//! process is this binary re-executed as `memfit dataload-worker`: it opens the dataset itself
//! (`ram`: its own copy of the pack; `mmap`: its own map of the same page-cache pages; `stream`:
//! it reads the loose files), reads jobs from its stdin and writes batches to its stdout.
//!
//! Pipe protocol. Job (text line): `EPOCH SEQ I1,I2,…`. Reply (binary, native endianness, same
//! machine): `SEQ: u64`, `N: u64` floats, then `4·N` bytes; `N = u64::MAX` marks an error,
//! followed by `LEN: u64` and `LEN` bytes of UTF-8 message.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::dataset::Source;
use super::pipeline::{Pipeline, epoch_order};
use super::{DataCase, Storage, WorkerKind};

/// Longest wait for one batch before the epoch is declared stuck.
const BATCH_TIMEOUT: Duration = Duration::from_secs(300);
const ERROR_MARK: u64 = u64::MAX;

/// What the loader did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadStats {
    pub images: u64,
    pub batches: u64,
    /// Seconds from each epoch's start to its first consumed batch, summed.
    pub startup_s: f64,
}

/// One job: the images of batch `seq` of `epoch`.
struct Job {
    epoch: u64,
    seq: usize,
    indices: Vec<u32>,
}

/// A finished job (`seq = usize::MAX`: a worker died).
struct Done {
    seq: usize,
    result: Result<Vec<f32>, String>,
}

enum Pool {
    Threads {
        jobs: Vec<Sender<Job>>,
        done: Receiver<Done>,
        handles: Vec<JoinHandle<()>>,
    },
    Processes {
        children: Vec<Child>,
        stdins: Vec<BufWriter<ChildStdin>>,
        done: Receiver<Done>,
        readers: Vec<JoinHandle<()>>,
    },
}

impl Pool {
    fn start(case: &DataCase, shared: &Option<Arc<Source>>, exe: &Path) -> anyhow::Result<Pool> {
        let (tx, rx) = mpsc::channel::<Done>();
        match case.kind {
            WorkerKind::Thread => {
                let source = shared
                    .clone()
                    .context("thread workers need the opened dataset")?;
                let mut jobs = Vec::new();
                let mut handles = Vec::new();
                for w in 0..case.workers {
                    let (jtx, jrx) = mpsc::channel::<Job>();
                    let (source, tx, crop, seed) =
                        (source.clone(), tx.clone(), case.crop, case.seed);
                    let h = std::thread::Builder::new()
                        .name(format!("dataload-{w}"))
                        .spawn(move || {
                            let mut p = Pipeline::new(crop);
                            for job in jrx {
                                let result = p
                                    .batch(&source, &job.indices, seed, job.epoch)
                                    .map_err(|e| format!("{e:#}"));
                                if tx
                                    .send(Done {
                                        seq: job.seq,
                                        result,
                                    })
                                    .is_err()
                                {
                                    break;
                                }
                            }
                        })
                        .context("starting a worker thread")?;
                    jobs.push(jtx);
                    handles.push(h);
                }
                Ok(Pool::Threads {
                    jobs,
                    done: rx,
                    handles,
                })
            }
            WorkerKind::Process => {
                let mut children = Vec::new();
                let mut stdins = Vec::new();
                let mut readers = Vec::new();
                for w in 0..case.workers {
                    let mut child = Command::new(exe)
                        .arg("dataload-worker")
                        .arg("--dataset")
                        .arg(&case.dataset)
                        .arg("--storage")
                        .arg(case.storage.as_str())
                        .arg("--crop")
                        .arg(case.crop.to_string())
                        .arg("--seed")
                        .arg(case.seed.to_string())
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::inherit())
                        .spawn()
                        .with_context(|| format!("starting {} dataload-worker", exe.display()))?;
                    let stdout = child.stdout.take().context("worker stdout")?;
                    stdins.push(BufWriter::new(child.stdin.take().context("worker stdin")?));
                    let tx = tx.clone();
                    readers.push(
                        std::thread::Builder::new()
                            .name(format!("dataload-reader-{w}"))
                            .spawn(move || read_replies(w, stdout, tx))
                            .context("starting a reader thread")?,
                    );
                    children.push(child);
                }
                Ok(Pool::Processes {
                    children,
                    stdins,
                    done: rx,
                    readers,
                })
            }
        }
    }

    fn send(&mut self, worker: usize, job: Job) -> anyhow::Result<()> {
        match self {
            Pool::Threads { jobs, .. } => jobs[worker]
                .send(job)
                .map_err(|_| anyhow::anyhow!("worker thread {worker} has stopped")),
            Pool::Processes { stdins, .. } => {
                let list: Vec<String> = job.indices.iter().map(u32::to_string).collect();
                let w = &mut stdins[worker];
                writeln!(w, "{} {} {}", job.epoch, job.seq, list.join(","))
                    .and_then(|()| w.flush())
                    .with_context(|| format!("sending a job to worker process {worker}"))
            }
        }
    }

    fn recv(&self) -> anyhow::Result<Done> {
        let done = match self {
            Pool::Threads { done, .. } | Pool::Processes { done, .. } => done,
        };
        match done.recv_timeout(BATCH_TIMEOUT) {
            Ok(d) => Ok(d),
            Err(RecvTimeoutError::Timeout) => {
                bail!("no batch from any worker for {} s", BATCH_TIMEOUT.as_secs())
            }
            Err(RecvTimeoutError::Disconnected) => bail!("every worker has stopped"),
        }
    }

    /// Stops the workers and waits for them (worker processes are reaped, so their CPU time
    /// joins this process's `RUSAGE_CHILDREN`).
    fn stop(self) -> anyhow::Result<()> {
        match self {
            Pool::Threads { jobs, handles, .. } => {
                drop(jobs);
                for h in handles {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a worker thread panicked"))?;
                }
            }
            Pool::Processes {
                mut children,
                stdins,
                readers,
                ..
            } => {
                drop(stdins);
                for (w, c) in children.iter_mut().enumerate() {
                    let status = c
                        .wait()
                        .with_context(|| format!("waiting for worker {w}"))?;
                    if !status.success() {
                        bail!("worker process {w} exited with {status}");
                    }
                }
                for r in readers {
                    let _ = r.join();
                }
            }
        }
        Ok(())
    }
}

/// Reads one worker process's replies until its stdout closes.
fn read_replies(worker: usize, stdout: impl Read, tx: Sender<Done>) {
    let mut r = BufReader::with_capacity(1 << 16, stdout);
    loop {
        match read_reply(&mut r) {
            Ok(Some(d)) => {
                if tx.send(d).is_err() {
                    return;
                }
            }
            Ok(None) => {
                // Closed: normal at shutdown; otherwise the main thread waits on a dead worker.
                let _ = tx.send(Done {
                    seq: usize::MAX,
                    result: Err(format!("worker process {worker} closed its output")),
                });
                return;
            }
            Err(e) => {
                let _ = tx.send(Done {
                    seq: usize::MAX,
                    result: Err(format!("reading worker process {worker}: {e:#}")),
                });
                return;
            }
        }
    }
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_ne_bytes(b))
}

/// One reply, or `None` at a clean end of stream.
fn read_reply(r: &mut impl Read) -> anyhow::Result<Option<Done>> {
    let mut b = [0u8; 8];
    match r.read(&mut b[..1])? {
        0 => return Ok(None),
        _ => r.read_exact(&mut b[1..])?,
    }
    let seq = u64::from_ne_bytes(b) as usize;
    let n = read_u64(r)?;
    if n == ERROR_MARK {
        let len = read_u64(r)? as usize;
        let mut msg = vec![0u8; len];
        r.read_exact(&mut msg)?;
        return Ok(Some(Done {
            seq,
            result: Err(String::from_utf8_lossy(&msg).into_owned()),
        }));
    }
    let mut data = vec![0f32; n as usize];
    // SAFETY: any byte pattern is a valid f32; the slice covers exactly `data`'s floats.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), data.len() * 4) };
    r.read_exact(bytes).context("reading a batch")?;
    Ok(Some(Done {
        seq,
        result: Ok(data),
    }))
}

fn write_reply(
    w: &mut impl Write,
    seq: usize,
    result: &Result<Vec<f32>, String>,
) -> std::io::Result<()> {
    w.write_all(&(seq as u64).to_ne_bytes())?;
    match result {
        Ok(data) => {
            w.write_all(&(data.len() as u64).to_ne_bytes())?;
            // SAFETY: viewing initialised f32s as their bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4) };
            w.write_all(bytes)?;
        }
        Err(msg) => {
            w.write_all(&ERROR_MARK.to_ne_bytes())?;
            w.write_all(&(msg.len() as u64).to_ne_bytes())?;
            w.write_all(msg.as_bytes())?;
        }
    }
    w.flush()
}

/// `memfit dataload-worker`: serves jobs from stdin until it closes.
pub fn serve(dataset: &Path, storage: Storage, crop: u32, seed: u64) -> anyhow::Result<()> {
    let source = Source::open(dataset, storage)?;
    let mut pipeline = Pipeline::new(crop);
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    for line in stdin.lines() {
        let line = line.context("reading a job")?;
        let (seq, result) = match parse_job(&line) {
            Ok(job) => (
                job.seq,
                pipeline
                    .batch(&source, &job.indices, seed, job.epoch)
                    .map_err(|e| format!("{e:#}")),
            ),
            Err(e) => (usize::MAX, Err(format!("{e:#}"))),
        };
        write_reply(&mut out, seq, &result).context("writing a batch")?;
    }
    Ok(())
}

fn parse_job(line: &str) -> anyhow::Result<Job> {
    let mut parts = line.split(' ');
    let mut next = |what: &str| {
        parts
            .next()
            .with_context(|| format!("job without {what}: {line}"))
    };
    let epoch = next("epoch")?.parse().context("epoch")?;
    let seq = next("seq")?.parse().context("seq")?;
    let indices = next("indices")?
        .split(',')
        .map(|s| s.parse::<u32>().context("index"))
        .collect::<anyhow::Result<_>>()?;
    Ok(Job {
        epoch,
        seq,
        indices,
    })
}

/// Runs `case.epochs` epochs; `consume(epoch, batch floats, images in it)` gets every batch in
/// order. `exe` is the binary worker processes run (normally `std::env::current_exe()`).
pub fn run_epochs(
    case: &DataCase,
    exe: &Path,
    mut consume: impl FnMut(u64, Vec<f32>, usize) -> anyhow::Result<()>,
) -> anyhow::Result<LoadStats> {
    // The main thread's own copy of the dataset: for loading in the main thread and for
    // thread workers (processes open theirs).
    let shared = if case.workers == 0 || case.kind == WorkerKind::Thread {
        Some(Arc::new(Source::open(&case.dataset, case.storage)?))
    } else {
        None
    };
    let n = match &shared {
        Some(s) => s.len(),
        None => super::dataset::read_manifest(&case.dataset)?.entries.len(),
    };
    anyhow::ensure!(n > 0, "the dataset has no image");
    let mut stats = LoadStats::default();
    let mut main_pipeline = (case.workers == 0).then(|| Pipeline::new(case.crop));
    let mut pool: Option<Pool> = None;
    for epoch in 0..case.epochs as u64 {
        let t0 = Instant::now();
        let order = epoch_order(n, case.seed, epoch);
        let batches: Vec<&[u32]> = order.chunks(case.batch).collect();
        if let Some(p) = main_pipeline.as_mut() {
            let source = shared.as_ref().expect("opened for the main thread");
            for (k, idx) in batches.iter().enumerate() {
                let data = p.batch(source, idx, case.seed, epoch)?;
                if k == 0 {
                    stats.startup_s += t0.elapsed().as_secs_f64();
                }
                consume(epoch, data, idx.len())?;
                stats.images += idx.len() as u64;
                stats.batches += 1;
            }
            continue;
        }
        if pool.is_none() {
            pool = Some(Pool::start(case, &shared, exe)?);
        }
        let p = pool.as_mut().expect("started");
        let in_flight = case.in_flight();
        let mut dispatched = 0;
        let dispatch = |p: &mut Pool, k: usize| {
            p.send(
                k % case.workers,
                Job {
                    epoch,
                    seq: k,
                    indices: batches[k].to_vec(),
                },
            )
        };
        while dispatched < batches.len() && dispatched < in_flight {
            dispatch(p, dispatched)?;
            dispatched += 1;
        }
        let mut early: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
        for k in 0..batches.len() {
            let data = loop {
                if let Some(d) = early.remove(&k) {
                    break d;
                }
                let d = p.recv()?;
                match d.result {
                    Ok(data) => {
                        early.insert(d.seq, data);
                    }
                    Err(msg) => bail!("epoch {epoch}, batch {}: {msg}", d.seq),
                }
            };
            if k == 0 {
                stats.startup_s += t0.elapsed().as_secs_f64();
            }
            consume(epoch, data, batches[k].len())?;
            stats.images += batches[k].len() as u64;
            stats.batches += 1;
            if dispatched < batches.len() {
                dispatch(p, dispatched)?;
                dispatched += 1;
            }
        }
        if !case.persistent {
            pool.take().expect("started").stop()?;
        }
    }
    if let Some(p) = pool {
        p.stop()?;
    }
    Ok(stats)
}

/// The binary worker processes run: this one.
pub fn current_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("finding this binary to start worker processes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip() {
        let mut buf = Vec::new();
        write_reply(&mut buf, 5, &Ok(vec![1.5, -2.0, 3.25])).unwrap();
        write_reply(&mut buf, 6, &Err("bad image".into())).unwrap();
        let mut r = buf.as_slice();
        let a = read_reply(&mut r).unwrap().unwrap();
        assert_eq!((a.seq, a.result), (5, Ok(vec![1.5, -2.0, 3.25])));
        let b = read_reply(&mut r).unwrap().unwrap();
        assert_eq!((b.seq, b.result), (6, Err("bad image".to_string())));
        assert!(read_reply(&mut r).unwrap().is_none());
    }

    #[test]
    fn jobs_parse() {
        let j = parse_job("2 17 4,0,9").unwrap();
        assert_eq!((j.epoch, j.seq, j.indices), (2, 17, vec![4, 0, 9]));
        assert!(parse_job("2 x 1").is_err());
    }
}
