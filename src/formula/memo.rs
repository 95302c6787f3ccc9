//! Replays remembered per case: a replay is a pure function of the [`Shape`] and the thread
//! count, and one question (`memfit predict` on one case: its phases, the graph, the totals,
//! the searches of `--fit-in`) asks for the same shape's phases several times. Each thread keeps
//! the last [`KEEP`] answers of each kind; a hit returns the stored value, byte for byte what
//! the replay would return again.

use std::cell::RefCell;

use super::replay::{Serving, Training};
use super::shape::Shape;

/// Answers kept per kind and thread (a search asks for a few dozen shapes).
pub const KEEP: usize = 64;

struct Memo<T> {
    entries: Vec<(Shape, usize, T)>,
}

impl<T: Copy> Memo<T> {
    const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    fn get(&self, shape: &Shape, threads: usize) -> Option<T> {
        self.entries
            .iter()
            .find(|(s, t, _)| *t == threads && s == shape)
            .map(|(_, _, v)| *v)
    }

    fn put(&mut self, shape: &Shape, threads: usize, v: T) {
        if self.entries.len() >= KEEP {
            self.entries.remove(0);
        }
        self.entries.push((shape.clone(), threads, v));
    }
}

thread_local! {
    static TRAINING: RefCell<Memo<Training>> = const { RefCell::new(Memo::new()) };
    static SERVING: RefCell<Memo<Serving>> = const { RefCell::new(Memo::new()) };
}

fn remembered<T: Copy>(
    memo: &'static std::thread::LocalKey<RefCell<Memo<T>>>,
    shape: &Shape,
    threads: usize,
    compute: impl FnOnce() -> T,
) -> T {
    if let Some(v) = memo.with(|m| m.borrow().get(shape, threads)) {
        return v;
    }
    let v = compute();
    memo.with(|m| m.borrow_mut().put(shape, threads, v));
    v
}

/// The training replay of `shape` on `threads` threads, computed once.
pub fn training(shape: &Shape, threads: usize, compute: impl FnOnce() -> Training) -> Training {
    remembered(&TRAINING, shape, threads, compute)
}

/// The serving replay of `shape` on `threads` threads, computed once.
pub fn serving(shape: &Shape, threads: usize, compute: impl FnOnce() -> Serving) -> Serving {
    remembered(&SERVING, shape, threads, compute)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remembered answer is the one computed; another shape or thread count is computed anew.
    #[test]
    fn remembers_per_shape_and_threads() {
        let s = Shape::new(2, 8, 16, 2, 1, 30, 8);
        let calls = std::cell::Cell::new(0);
        let compute = |shape: &Shape, threads| {
            calls.set(calls.get() + 1);
            super::super::replay::replay_training(shape, 0, Some(threads))
        };
        let a = training(&s, 1, || compute(&s, 1));
        let b = training(&s, 1, || compute(&s, 1));
        assert_eq!((a, calls.get()), (b, 1));
        let other = Shape { b: 3, ..s.clone() };
        let c = training(&other, 1, || compute(&other, 1));
        assert_eq!(calls.get(), 2);
        assert_ne!(a, c);
        training(&s, 2, || compute(&s, 2));
        assert_eq!(calls.get(), 3);
    }
}
