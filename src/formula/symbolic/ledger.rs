//! The ledger: the live bytes of the symbolic tensors and their high-water mark, tagged by
//! part (segments), with the windows a replay opens and the host bytes it counts beside them.

use super::*;

/// Live bytes and their high-water mark.
#[derive(Debug, Default)]
pub struct Ledger {
    pub(super) current: Cell<u64>,
    pub(super) peak: Cell<u64>,
    pub(super) next_id: Cell<u64>,
    /// The part of the model being built or run ([`Ledger::set_tag`]); tensors remember it.
    pub(super) tag: Cell<u32>,
    /// Recording segments ([`Ledger::record`]): the highest level of the segment under way.
    pub(super) recording: Cell<bool>,
    pub(super) seg_max: Cell<u64>,
    /// The segment under way has allocated (a segment that only frees reaches no new level
    /// and is not counted).
    pub(super) seg_alloc: Cell<bool>,
    pub(super) segments: std::cell::RefCell<Segments>,
    /// Bookkeeping bytes charged per live tensor (0: count data only).
    pub meta_per_tensor: u64,
    /// `Some(threads)`: add `gemm`'s transient packing buffer to every matmul
    /// ([`super::gemm::scratch_bytes`]) for candle running on `threads` threads.
    pub gemm_threads: Option<usize>,
    /// Every change of the live bytes while tracing ([`Ledger::start_trace`]), in order.
    pub(super) trace: std::cell::RefCell<Option<Vec<Event>>>,
    /// The stage the driver says the replay is in ([`Ledger::set_stage`]), for the trace.
    pub(super) stage: Cell<&'static str>,
    /// The backward node being differentiated: the label of op-less tensors made meanwhile.
    pub(super) context: Cell<&'static str>,
    pub(super) next_storage: Cell<u64>,
    /// The replayed device is a GPU: a kernel that keeps scratch there (the fused
    /// cross-entropy's per-row losses) charges it.
    pub cuda: Cell<bool>,
}

impl Ledger {
    pub fn new(meta_per_tensor: u64, gemm_threads: Option<usize>) -> Rc<Self> {
        Rc::new(Self {
            meta_per_tensor,
            gemm_threads,
            ..Self::default()
        })
    }

    /// Starts recording every change of the live bytes ([`Event`]); [`Ledger::take_trace`]
    /// ends it.
    pub fn start_trace(&self) {
        *self.trace.borrow_mut() = Some(Vec::new());
    }

    /// The events recorded since [`Ledger::start_trace`] (empty when not tracing).
    pub fn take_trace(&self) -> Vec<Event> {
        self.trace.borrow_mut().take().unwrap_or_default()
    }

    /// Names the stage the next events belong to (`forward`, `backward`, …).
    pub fn set_stage(&self, stage: &'static str) {
        self.stage.set(stage);
        self.context.set("");
    }

    pub(super) fn note(&self, id: u64, delta: i64, label: &'static str) {
        if delta == 0 {
            return;
        }
        if let Some(t) = self.trace.borrow_mut().as_mut() {
            t.push(Event {
                id,
                delta,
                label,
                tag: self.tag.get(),
                stage: self.stage.get(),
            });
        }
    }

    pub(super) fn alloc_as(&self, bytes: u64, id: u64, label: &'static str) {
        self.note(id, bytes as i64, label);
        self.alloc(bytes);
    }

    pub(super) fn free_as(&self, bytes: u64, id: u64) {
        self.note(id, -(bytes as i64), "");
        self.free(bytes);
    }

    pub(super) fn alloc(&self, bytes: u64) {
        let now = self.current.get() + bytes;
        self.current.set(now);
        if now > self.peak.get() {
            self.peak.set(now);
        }
        if self.recording.get() {
            self.seg_alloc.set(true);
            if now > self.seg_max.get() {
                self.seg_max.set(now);
            }
        }
    }

    /// Starts recording segments: from now on each window ([`Ledger::reset_peak`] to
    /// [`Ledger::window_peak`]) keeps, per tag and per occurrence of that tag, the highest
    /// level reached while the tag was set ([`Windows`]).
    pub fn record(&self) {
        self.recording.set(true);
        self.seg_max.set(self.current.get());
    }

    /// The windows recorded so far.
    pub fn recorded(&self) -> Windows {
        Windows(self.segments.borrow().done.clone())
    }

    /// The tag now set (0: outside any tagged part).
    pub fn tag(&self) -> u32 {
        self.tag.get()
    }

    /// Sets the tag: what is allocated from now on is the tagged part's (a segment ends when
    /// the tag changes).
    pub fn set_tag(&self, tag: u32) {
        if tag == self.tag.get() {
            return;
        }
        if self.recording.get() {
            self.close_segment();
        }
        self.tag.set(tag);
    }

    pub(super) fn close_segment(&self) {
        if !self.seg_alloc.replace(false) {
            self.seg_max.set(self.current.get());
            return;
        }
        let mut s = self.segments.borrow_mut();
        let tag = self.tag.get();
        let occ = s.occurrences.entry(tag).or_insert(0);
        let key = (tag, *occ);
        *occ += 1;
        // Each occurrence is a key of its own.
        s.maxima.insert(key, self.seg_max.get());
        self.seg_max.set(self.current.get());
    }

    /// The window's peak above `base` (`peak − base`); when recording, the window's segments
    /// are kept ([`Ledger::recorded`]).
    pub fn window_peak(&self, base: u64) -> u64 {
        if self.recording.get() {
            self.close_segment();
            let mut s = self.segments.borrow_mut();
            let maxima = std::mem::take(&mut s.maxima);
            s.occurrences.clear();
            s.done.push(Window { base, maxima });
        }
        self.peak.get() - base
    }

    pub(super) fn free(&self, bytes: u64) {
        self.current.set(self.current.get() - bytes);
    }

    /// Bytes live now.
    pub fn current(&self) -> u64 {
        self.current.get()
    }

    /// High-water mark since the last [`Ledger::reset_peak`].
    pub fn peak(&self) -> u64 {
        self.peak.get()
    }

    /// Sets the high-water mark to the current value and returns it (a window's baseline).
    pub fn reset_peak(&self) -> u64 {
        if self.recording.get() {
            let mut s = self.segments.borrow_mut();
            s.maxima.clear();
            s.occurrences.clear();
            self.seg_max.set(self.current.get());
            self.seg_alloc.set(false);
        }
        self.peak.set(self.current.get());
        self.current.get()
    }

    /// `bytes` of host memory outside any tensor (a `Vec` the model fills), counted where the
    /// meter sees host memory (the CPU: `gemm_threads` set); freed when the guard drops, or
    /// turned into a tensor's storage ([`HostBytes::into_tensor`]).
    pub fn host(self: &Rc<Self>, bytes: usize) -> HostBytes {
        let bytes = if self.gemm_threads.is_some() {
            bytes as u64
        } else {
            0
        };
        let id = self.storage_id();
        self.alloc_as(bytes, id, "host");
        HostBytes {
            ledger: self.clone(),
            bytes,
            id,
        }
    }

    /// gemm's transient packing buffer for one product of layouts `la · ra` (nothing unless
    /// `gemm_threads` is set): allocated and freed at once, so it only raises the peak.
    pub(super) fn gemm_pack(&self, la: &Layout, ra: &Layout, dtype: DType) {
        if let Some(threads) = self.gemm_threads {
            let scratch = gemm_scratch(la, ra, dtype, threads);
            self.alloc_as(scratch, WORKSPACE, "gemm");
            self.free_as(scratch, WORKSPACE);
        }
    }

    pub(super) fn id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// A storage's (or host buffer's) [`Event::id`], from a counter of its own: the tensors'
    /// ids, which order the backward's work, stay what they are without a trace.
    pub(super) fn storage_id(&self) -> u64 {
        let id = self.next_storage.get();
        self.next_storage.set(id + 1);
        id
    }
}

/// The segments of the window under way and the windows done.
#[derive(Debug, Default)]
pub(super) struct Segments {
    pub(super) occurrences: HashMap<u32, u32>,
    pub(super) maxima: HashMap<(u32, u32), u64>,
    pub(super) done: Vec<Window>,
}

/// One recorded window: its baseline and, per `(tag, occurrence)` — the `n`-th time the tag
/// was set in the window — the highest level (bytes, not above the baseline) reached then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub base: u64,
    pub maxima: HashMap<(u32, u32), u64>,
}

/// The windows of one recorded replay, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows(pub Vec<Window>);

/// Host bytes on a [`Ledger`] (see [`Ledger::host`]).
pub struct HostBytes {
    pub(super) ledger: Rc<Ledger>,
    pub(super) bytes: u64,
    pub(super) id: u64,
}

impl HostBytes {
    /// `Tensor::from_vec`: the vector becomes the storage of an untracked tensor `dims` (on
    /// CUDA it is uploaded: the device tensor is new, the host vector freed).
    pub fn into_tensor(self, dims: &[usize], dtype: DType) -> Sym {
        let ledger = self.ledger.clone();
        drop(self);
        Sym::new(&ledger, dims, dtype)
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        self.ledger.free_as(self.bytes, self.id);
    }
}
