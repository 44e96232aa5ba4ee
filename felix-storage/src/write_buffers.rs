//! A log's write buffers, reused once every holder has let go.
//!
//! Each record write hands the runtime one buffer, and the tail cache keeps slices of it
//! until they age out. A fresh allocation per write (hundreds of KiB under load) costs more
//! than the copy into it: the allocator returns freed memory to the kernel, so every new
//! buffer page-faults and is zeroed page by page on the engine thread. Keeping the buffers
//! of completed writes and taking the oldest back once nothing else references it (the tail
//! cache evicts oldest first, so it frees up first) turns that into plain reuse.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// Completed writes kept for reuse. Past this a log keeps no more (the dropped handle only
/// means that buffer is freed when its last slice goes); at the default tail cache and
/// write sizes a few dozen are referenced at any moment.
const MAX_RETIRED: usize = 64;
/// Smaller buffers are not worth keeping: allocating them is cheap.
const MIN_REUSED_BYTES: usize = 64 << 10;
/// Headroom stops here (the log's write buffer bound), so what the tail cache pins stays
/// within about twice the bytes it holds.
const MAX_HEADROOM_BYTES: usize = super::log::WRITE_BUFFER_MAX_BYTES;

#[derive(Debug, Default)]
pub(crate) struct WriteBuffers {
    /// Whole buffers of completed writes, oldest first.
    retired: VecDeque<Bytes>,
    /// Buffers handed out again rather than allocated (for tests and profiles).
    reused: u64,
}

impl WriteBuffers {
    /// Keeps the buffer of a completed write (all of it: the bytes handed to the runtime).
    pub(crate) fn retire(&mut self, whole: Bytes) {
        if whole.len() < MIN_REUSED_BYTES {
            return;
        }
        if self.retired.len() == MAX_RETIRED {
            self.retired.pop_front();
        }
        self.retired.push_back(whole);
    }

    #[cfg(test)]
    pub(crate) fn reused(&self) -> u64 {
        self.reused
    }

    /// An empty buffer with room for `room` bytes: the oldest retired one when nothing else
    /// holds it and its size suits, else a new allocation.
    pub(crate) fn take(&mut self, room: usize) -> BytesMut {
        if let Some(oldest) = self.retired.pop_front() {
            match oldest.try_into_mut() {
                Ok(mut buf) => {
                    // One much larger than asked for is freed instead: the tail cache would
                    // pin all of it for a small write.
                    if (room..=room.saturating_mul(4)).contains(&buf.capacity()) {
                        buf.clear();
                        self.reused += 1;
                        return buf;
                    }
                }
                // Still referenced (tail cache, a reader, the runtime): try again next time.
                Err(oldest) => self.retired.push_front(oldest),
            }
        }
        // Twice the room, rounded up: appends made while a write and a sync are in flight
        // often outgrow the last write, and growing a buffer in place copies it into fresh
        // pages; rounding lets writes of similar size reuse each other's buffers.
        let ample = (room * 2)
            .next_power_of_two()
            .min(MAX_HEADROOM_BYTES)
            .max(room);
        BytesMut::with_capacity(ample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn filled(buf: &mut BytesMut, n: usize) -> Bytes {
        buf.put_bytes(7, n);
        std::mem::take(buf).freeze()
    }

    #[test]
    fn a_buffer_comes_back_only_once_nothing_references_it() {
        let mut pool = WriteBuffers::default();
        let mut buf = pool.take(256 << 10);
        let addr = buf.as_ptr();
        let whole = filled(&mut buf, 200 << 10);
        let slice = whole.slice(10..20); // the tail cache's view
        pool.retire(whole);
        // Referenced by the slice: a fresh buffer, and the retired one stays queued.
        let other = pool.take(256 << 10);
        assert_ne!(other.as_ptr(), addr);
        assert_eq!(pool.retired.len(), 1);
        drop(slice);
        let again = pool.take(256 << 10);
        assert_eq!(again.as_ptr(), addr, "the same allocation is reused");
        assert!(again.is_empty() && again.capacity() >= 256 << 10);
        assert!(pool.retired.is_empty());
    }

    #[test]
    fn only_buffers_of_a_fitting_size_are_reused() {
        let mut pool = WriteBuffers::default();
        let mut small = BytesMut::with_capacity(1024);
        pool.retire(filled(&mut small, 100));
        assert!(pool.retired.is_empty(), "small buffers are not kept");
        // Too small for the room asked: freed, and a new one is big enough.
        let mut mid = BytesMut::with_capacity(100 << 10);
        pool.retire(filled(&mut mid, 100 << 10));
        let big = pool.take(1 << 20);
        assert!(big.capacity() >= 1 << 20);
        assert!(pool.retired.is_empty());
        // Far larger than needed: freed rather than pinned by a small write (a freed
        // address may come back from the allocator, so capacities tell them apart).
        let mut large = BytesMut::with_capacity(1 << 20);
        pool.retire(filled(&mut large, 1 << 20));
        let small = pool.take(4 << 10);
        assert!((4 << 10..1 << 20).contains(&small.capacity()));
        assert!(pool.retired.is_empty());
    }

    #[test]
    fn past_the_cap_the_oldest_retired_buffer_is_let_go() {
        let mut pool = WriteBuffers::default();
        let mut first_addr = None;
        for _ in 0..=MAX_RETIRED {
            let mut buf = BytesMut::with_capacity(MIN_REUSED_BYTES);
            let whole = filled(&mut buf, MIN_REUSED_BYTES);
            first_addr.get_or_insert(whole.as_ptr());
            pool.retire(whole);
        }
        assert_eq!(pool.retired.len(), MAX_RETIRED);
        assert_ne!(
            pool.retired[0].as_ptr(),
            first_addr.unwrap(),
            "the oldest went"
        );
    }

    /// Through a real log: writes reuse earlier buffers once the tail cache drops them, and
    /// every record still reads back right (from the tail cache and from the files).
    #[test]
    fn a_busy_log_reuses_its_write_buffers_and_loses_nothing() {
        use crate::log::{Batch, FsyncMode, LogConfig, LogEvent, ShardLog};
        use crate::memfs::MemFs;
        use crate::ops::{FileOpKind, LogId};
        use std::time::Instant;

        let cfg = LogConfig {
            fsync: FsyncMode::OnCommit,
            tail_cache_bytes: 256 << 10,
            ..LogConfig::default()
        };
        let now = Instant::now();
        let mut fs = MemFs::new();
        let mut log = ShardLog::open(LogId(1), "s".into(), cfg, now);
        let mut durable = 0;
        let mut write_ptrs = Vec::new();
        let mut reads = Vec::new();
        let pump = |log: &mut ShardLog, fs: &mut MemFs, ptrs: &mut Vec<usize>| {
            for _ in 0..10_000 {
                let Some(op) = log.poll_op() else {
                    break;
                };
                if let FileOpKind::Append { bytes, .. } = &op.kind {
                    if bytes.len() > 1024 {
                        ptrs.push(bytes.as_ptr() as usize);
                    }
                }
                if let Some(c) = fs.execute(op) {
                    log.handle_completion(c);
                }
            }
            let mut events = Vec::new();
            while let Some(e) = log.poll_event() {
                events.push(e);
            }
            events
        };
        for e in pump(&mut log, &mut fs, &mut write_ptrs) {
            assert!(matches!(e, LogEvent::Opened { .. }));
        }
        // 40 writes of 16 records × 8 KiB: far more than the tail cache holds.
        let record = |i: u64| Bytes::from(vec![(i % 251) as u8; 8 << 10]);
        for w in 0..40u64 {
            let payloads: Vec<Bytes> = (0..16).map(|k| record(w * 16 + k)).collect();
            let batch = Batch {
                time_us: 1,
                publisher: None,
                payloads: &payloads,
            };
            assert_eq!(log.append(now, batch).expect("append"), w * 16);
            for e in pump(&mut log, &mut fs, &mut write_ptrs) {
                if let LogEvent::Durable { up_to } = e {
                    durable = up_to;
                }
            }
        }
        assert_eq!(durable, 640);
        assert_eq!(write_ptrs.len(), 40);
        // The tail cache holds about four writes; every write after those reuses one.
        assert!(
            log.write_buffers().reused() >= 30,
            "{} of 40 writes reused a buffer",
            log.write_buffers().reused()
        );
        // Every record reads back intact, the old ones from the files.
        let mut from = 0;
        for _ in 0..1_000 {
            if from == 640 {
                break;
            }
            log.read(from, 100, 1 << 20).expect("read");
            for e in pump(&mut log, &mut fs, &mut write_ptrs) {
                if let LogEvent::Read { result, .. } = e {
                    reads.push(result.expect("read ok"));
                }
            }
            let page = reads.pop().expect("answered");
            for b in &page.batches {
                for (i, p) in b.payloads.iter().enumerate() {
                    assert_eq!(p, &record(b.first_offset + i as u64));
                }
            }
            from = page.next_offset;
        }
        assert_eq!(from, 640);
    }
}
