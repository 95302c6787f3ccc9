//! The collectives a rank's step uses, over an existing library: MPI (the `mpi` crate, Open MPI
//! or MPICH, feature `ranks`), launched by `mpirun` or Slurm's `srun`. No transport of memfit's
//! own: [`Solo`] is the one-process group (every collective the identity), for a run without
//! MPI and for the single-process reference.
//!
//! Every buffer is an `f32` slice the caller owns (a tensor's storage, through
//! [`super::zero::with_f32_mut`]): the library's own buffers (eager and rendezvous buffers,
//! shared-memory segments) are allocated by it, outside memfit's counting allocator, and show
//! only on the process layer (RSS).

/// A group of ranks and the collectives the sharded step needs.
pub trait Comm {
    /// This process's rank, 0-based.
    fn rank(&self) -> usize;
    /// The ranks in the group.
    fn size(&self) -> usize;
    /// `recv[i] = Σ over ranks of send[i]`, on every rank.
    fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]);
    /// `recv[i] = max over ranks of send[i]`, on every rank (the vocab-parallel loss's row
    /// maxima).
    fn all_reduce_max(&self, send: &[f32], recv: &mut [f32]);
    /// `send` summed over the ranks, rank `r` receiving run `r` of `recv.len()` elements
    /// (`MPI_Reduce_scatter_block`; `send.len() = size · recv.len()`): sequence parallelism's
    /// reduce-scatter.
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]);
    /// `recv[i] = Σ over ranks of send[i]` on `root` (`recv` is `Some` there, `None` elsewhere).
    fn reduce_sum(&self, root: usize, send: &[f32], recv: Option<&mut [f32]>);
    /// `buf` of `root` copied into `buf` of every rank, in place.
    fn broadcast(&self, root: usize, buf: &mut [f32]);
    /// Every rank's `send` into `recv` on every rank (`MPI_Allgatherv`): rank `r`'s lands at
    /// [`super::zero::run_of`]`(recv.len(), size, r)`, the run it must send (ZeRO 3's gather of
    /// a parameter from its shards).
    fn all_gather_into(&self, send: &[f32], recv: &mut [f32]);
    /// Every rank's `send` (of any length), on every rank, in rank order.
    fn all_gather_bytes(&self, send: &[u8]) -> Vec<Vec<u8>>;
    /// Waits until every rank is here.
    fn barrier(&self);
    /// `buf` sent to rank `to` (blocking: returns once the library holds it or `to` has it).
    fn send(&self, to: usize, buf: &[f32]);
    /// `buf` filled by what rank `from` sends.
    fn recv(&self, from: usize, buf: &mut [f32]);
    /// `send` to rank `to` and `recv` from rank `from` at once (`MPI_Sendrecv`): the pipeline's
    /// paired exchanges, which two blocking calls in a fixed order would deadlock.
    fn send_recv(&self, to: usize, send: &[f32], from: usize, recv: &mut [f32]);
    /// Every rank sends a run of `send` to each rank and receives one from each
    /// (`MPI_Alltoallv`): `send_counts[r]` elements to rank `r`, in rank order from the start
    /// of `send`; `recv_counts[r]` from rank `r`, in rank order into `recv` (expert
    /// parallelism's dispatch and return of token rows).
    fn all_to_all_v(
        &self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    );
    /// The group of the ranks that give the same `color` (`MPI_Comm_split`, in this group's
    /// rank order): hybrid sharding's shard and replica groups. Every rank calls it.
    fn split(&self, color: usize) -> Box<dyn Comm>;
}

/// One process: every collective is the identity.
pub struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
    fn all_reduce_max(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
    fn reduce_sum(&self, _root: usize, send: &[f32], recv: Option<&mut [f32]>) {
        if let Some(r) = recv {
            r.copy_from_slice(send);
        }
    }
    fn broadcast(&self, _root: usize, _buf: &mut [f32]) {}
    fn all_gather_into(&self, send: &[f32], recv: &mut [f32]) {
        recv.copy_from_slice(send);
    }
    fn all_gather_bytes(&self, send: &[u8]) -> Vec<Vec<u8>> {
        vec![send.to_vec()]
    }
    fn barrier(&self) {}
    fn send(&self, to: usize, _buf: &[f32]) {
        panic!("one process has no rank {to} to send to")
    }
    fn recv(&self, from: usize, _buf: &mut [f32]) {
        panic!("one process has no rank {from} to receive from")
    }
    fn send_recv(&self, to: usize, _send: &[f32], _from: usize, _recv: &mut [f32]) {
        panic!("one process has no rank {to} to exchange with")
    }
    fn all_to_all_v(
        &self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) {
        assert_eq!(
            (send_counts, recv_counts),
            (&[send.len()][..], &[recv.len()][..])
        );
        recv.copy_from_slice(send);
    }
    fn split(&self, _color: usize) -> Box<dyn Comm> {
        Box::new(Solo)
    }
}

#[cfg(feature = "ranks")]
pub use self::mpi_comm::Mpi;

#[cfg(feature = "ranks")]
mod mpi_comm {
    use mpi::Count;
    use mpi::collective::SystemOperation;
    use mpi::datatype::{Partition, PartitionMut};
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;

    /// `MPI_COMM_WORLD` of an initialised MPI (finalised when dropped).
    pub struct Mpi {
        world: SimpleCommunicator,
        // Dropped last: finalises MPI (none in a group split from the world, which must be
        // dropped before the world's).
        _universe: Option<mpi::environment::Universe>,
    }

    impl Mpi {
        /// Initialises MPI; `None` when it was initialised already.
        pub fn init() -> Option<Self> {
            let universe = mpi::initialize()?;
            Some(Mpi {
                world: universe.world(),
                _universe: Some(universe),
            })
        }

        /// The MPI library's version string (`MPI_Get_library_version`).
        pub fn library() -> String {
            mpi::environment::library_version()
                .unwrap_or_else(|_| "unknown".into())
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
    }

    /// Where each rank's run starts when the runs of `counts` lie one after the other.
    fn displacements(counts: &[Count]) -> Vec<Count> {
        counts
            .iter()
            .scan(0, |at, &n| {
                let d = *at;
                *at += n;
                Some(d)
            })
            .collect()
    }

    impl super::Comm for Mpi {
        fn rank(&self) -> usize {
            self.world.rank() as usize
        }
        fn size(&self) -> usize {
            self.world.size() as usize
        }
        fn all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) {
            self.world
                .all_reduce_into(send, recv, SystemOperation::sum());
        }
        fn all_reduce_max(&self, send: &[f32], recv: &mut [f32]) {
            self.world
                .all_reduce_into(send, recv, SystemOperation::max());
        }
        fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) {
            assert_eq!(
                send.len(),
                self.size() * recv.len(),
                "reduce_scatter_sum: every rank's run"
            );
            self.world
                .reduce_scatter_block_into(send, recv, SystemOperation::sum());
        }
        fn reduce_sum(&self, root: usize, send: &[f32], recv: Option<&mut [f32]>) {
            let p = self.world.process_at_rank(root as i32);
            match recv {
                Some(r) => p.reduce_into_root(send, r, SystemOperation::sum()),
                None => p.reduce_into(send, SystemOperation::sum()),
            }
        }
        fn broadcast(&self, root: usize, buf: &mut [f32]) {
            self.world.process_at_rank(root as i32).broadcast_into(buf);
        }
        fn all_gather_into(&self, send: &[f32], recv: &mut [f32]) {
            let (n, size) = (recv.len(), self.size());
            assert_eq!(
                send.len(),
                crate::ranks::zero::run_of(n, size, self.rank()).len(),
                "all_gather_into: a rank sends its own run"
            );
            // Rank r's run of n: ⌈n/size⌉ from r·⌈n/size⌉, the last shorter or empty.
            let counts: Vec<Count> = (0..size)
                .map(|r| crate::ranks::zero::run_of(n, size, r).len() as Count)
                .collect();
            let displs: Vec<Count> = (0..size)
                .map(|r| crate::ranks::zero::run_of(n, size, r).start as Count)
                .collect();
            let mut parts = PartitionMut::new(recv, &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(send, &mut parts);
        }
        fn all_gather_bytes(&self, send: &[u8]) -> Vec<Vec<u8>> {
            let mut counts = vec![0 as Count; self.size()];
            self.world
                .all_gather_into(&(send.len() as Count), &mut counts[..]);
            let displs = displacements(&counts);
            let mut all = vec![0u8; counts.iter().sum::<Count>() as usize];
            let mut parts = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(send, &mut parts);
            counts
                .iter()
                .zip(&displs)
                .map(|(&n, &d)| all[d as usize..(d + n) as usize].to_vec())
                .collect()
        }
        fn barrier(&self) {
            self.world.barrier();
        }
        fn send(&self, to: usize, buf: &[f32]) {
            self.world.process_at_rank(to as i32).send(buf);
        }
        fn recv(&self, from: usize, buf: &mut [f32]) {
            self.world.process_at_rank(from as i32).receive_into(buf);
        }
        fn send_recv(&self, to: usize, send: &[f32], from: usize, recv: &mut [f32]) {
            mpi::point_to_point::send_receive_into(
                send,
                &self.world.process_at_rank(to as i32),
                recv,
                &self.world.process_at_rank(from as i32),
            );
        }
        fn all_to_all_v(
            &self,
            send: &[f32],
            send_counts: &[usize],
            recv: &mut [f32],
            recv_counts: &[usize],
        ) {
            // Counts and displacements in elements, each rank's run after the one before.
            let runs = |counts: &[usize]| -> (Vec<Count>, Vec<Count>) {
                let c: Vec<Count> = counts.iter().map(|&n| n as Count).collect();
                let d = displacements(&c);
                (c, d)
            };
            let (sc, sd) = runs(send_counts);
            let (rc, rd) = runs(recv_counts);
            assert_eq!(send_counts.iter().sum::<usize>(), send.len());
            assert_eq!(recv_counts.iter().sum::<usize>(), recv.len());
            let out = Partition::new(send, &sc[..], &sd[..]);
            let mut into = PartitionMut::new(recv, &rc[..], &rd[..]);
            self.world.all_to_all_varcount_into(&out, &mut into);
        }
        fn split(&self, color: usize) -> Box<dyn super::Comm> {
            let color = mpi::topology::Color::with_value(color as i32);
            let world = self
                .world
                .split_by_color(color)
                .expect("a defined color joins a group");
            Box::new(Mpi {
                world,
                _universe: None,
            })
        }
    }
}
