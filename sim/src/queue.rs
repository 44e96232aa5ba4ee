//! The event queue: future events ordered by (time, insertion sequence), so two events at the
//! same instant always run in the order they were scheduled.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(Instant, u64, Slot<E>)>>,
    seq: u64,
}

/// Wraps the payload so the heap orders by (time, seq) only.
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> EventQueue<E> {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    pub(crate) fn push(&mut self, at: Instant, event: E) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, Slot(event))));
    }

    pub(crate) fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The earliest event if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<E> {
        if self.peek_time()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse((_, _, Slot(e)))| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn orders_by_time_then_insertion() {
        let t = Instant::now();
        let mut q = EventQueue::new();
        q.push(t + Duration::from_millis(2), "late");
        q.push(t, "first");
        q.push(t, "second");
        assert_eq!(q.pop_due(t), Some("first"));
        assert_eq!(q.pop_due(t), Some("second"));
        assert_eq!(q.pop_due(t), None);
        assert_eq!(q.pop_due(t + Duration::from_millis(2)), Some("late"));
    }
}
