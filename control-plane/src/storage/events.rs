//! The committed events subscribers resume from, in memory: from the events floor (the
//! snapshot point, less the events kept behind it for lagging subscribers, or higher when
//! the events since it would hold more than their byte budget) to the applied index.
//! Nothing here needs a disk: a restarted node applies its log again from its snapshot,
//! which rebuilds these events, and a subscriber resuming from under the floor
//! gets the whole state instead. (They were in sled before: a second write of every entry
//! on the Raft thread, and sled 0.34 stores a large value as a file of its own, an open,
//! write and close per event under load.)

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::state::EntryEvent;

/// An event and the payload bytes of its log entry (what it holds, roughly).
#[derive(Debug)]
struct Kept {
    event: Arc<EntryEvent>,
    bytes: u64,
}

/// The events kept and the payload bytes they hold together.
#[derive(Debug, Default)]
struct Held {
    events: VecDeque<Kept>,
    bytes: u64,
}

impl Held {
    /// Takes out the events up to `index`.
    fn drain_to(&mut self, index: u64) -> Vec<Arc<EntryEvent>> {
        let covered = self
            .events
            .partition_point(|kept| kept.event.index <= index);
        self.events
            .drain(..covered)
            .map(|kept| {
                self.bytes -= kept.bytes;
                kept.event
            })
            .collect()
    }
}

/// Committed events by ascending index (Raft's own entries have none, so indexes may skip).
#[derive(Debug, Default)]
pub struct EventLog {
    events: Mutex<Held>,
    /// Events up to this index are not served: a subscriber that needs one of them gets the
    /// whole state instead. Read on every subscriber step, so kept apart from the lock.
    floor: AtomicU64,
}

impl EventLog {
    /// An empty log whose events up to `floor` are gone (a snapshot covers them).
    pub fn new(floor: u64) -> Self {
        Self {
            events: Mutex::default(),
            floor: AtomicU64::new(floor),
        }
    }

    /// Keeps the event of a newly applied entry of `bytes` payload, and lets the oldest go
    /// (raising the floor) while those kept hold more than `budget` bytes: between two
    /// snapshots the events would otherwise hold as much as the log itself, a second copy of
    /// it in memory. An index at or under the last one kept (an entry applied again)
    /// replaces nothing: events of one index are equal.
    pub fn record(&self, event: Arc<EntryEvent>, bytes: u64, budget: u64) {
        if event.index <= self.floor() {
            return;
        }
        let mut held = self.events.lock();
        if held
            .events
            .back()
            .is_some_and(|last| last.event.index >= event.index)
        {
            return;
        }
        held.events.push_back(Kept { event, bytes });
        held.bytes += bytes;
        while held.bytes > budget && held.events.len() > 1 {
            let Some(oldest) = held.events.pop_front() else {
                break;
            };
            held.bytes -= oldest.bytes;
            self.floor.store(oldest.event.index, Ordering::Release);
        }
    }

    /// Events from index `from` on, in order, at most `limit`; `None` when `from` is at or
    /// under the floor. Read under the lock that raises the floor, so that a floor raised after
    /// the caller last looked cannot make it skip the events in between.
    pub fn resume_from(&self, from: u64, limit: usize) -> Option<Vec<Arc<EntryEvent>>> {
        let held = self.events.lock();
        if from <= self.floor() {
            return None;
        }
        let start = held.events.partition_point(|kept| kept.event.index < from);
        Some(
            held.events
                .range(start..)
                .take(limit)
                .map(|kept| Arc::clone(&kept.event))
                .collect(),
        )
    }

    /// The floor a compaction at `snapshot` leaves: at most `events` events, and at most
    /// `bytes` of their payload, kept behind the snapshot for subscribers a little behind
    /// (an event may batch hundreds of cache entries, so a count alone does not bound the
    /// memory).
    pub fn retention_floor(&self, snapshot: u64, events: u64, bytes: u64) -> u64 {
        let held = self.events.lock();
        let covered = held.events.partition_point(|k| k.event.index <= snapshot);
        let mut floor = snapshot.saturating_sub(events).max(self.floor());
        let mut behind = 0;
        for k in held.events.range(..covered).rev() {
            behind += k.bytes;
            if behind > bytes {
                floor = floor.max(k.event.index);
                break;
            }
        }
        floor
    }

    pub fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    /// Stops serving events up to `index` (a compaction, or a snapshot from the leader
    /// installed in their place) and returns them, to be freed beside the Raft thread:
    /// freeing thousands of events' entries there held it for tens of milliseconds. The
    /// floor never goes back.
    pub fn raise_floor(&self, index: u64) -> Vec<Arc<EntryEvent>> {
        let mut held = self.events.lock();
        if index <= self.floor() {
            return Vec::new();
        }
        self.floor.store(index, Ordering::Release);
        held.drain_to(index)
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.events.lock().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(index: u64) -> Arc<EntryEvent> {
        Arc::new(EntryEvent::empty(index))
    }

    fn indexes(events: &[Arc<EntryEvent>]) -> Vec<u64> {
        events.iter().map(|e| e.index).collect()
    }

    #[test]
    fn events_are_served_from_an_index_across_gaps() {
        let log = EventLog::new(2);
        for index in [1, 2, 3, 5, 6, 9] {
            log.record(event(index), 10, u64::MAX);
        }
        assert!(log.resume_from(1, 10).is_none(), "under the floor: dropped");
        assert_eq!(indexes(&log.resume_from(3, 10).unwrap()), [3, 5, 6, 9]);
        assert_eq!(
            indexes(&log.resume_from(4, 10).unwrap()),
            [5, 6, 9],
            "4 has no event"
        );
        assert_eq!(indexes(&log.resume_from(5, 2).unwrap()), [5, 6]);
        assert!(log.resume_from(10, 10).unwrap().is_empty());
    }

    #[test]
    fn an_entry_applied_again_is_kept_once() {
        let log = EventLog::new(0);
        for index in [1, 2, 2, 1, 3] {
            log.record(event(index), 10, u64::MAX);
        }
        assert_eq!(indexes(&log.resume_from(1, 10).unwrap()), [1, 2, 3]);
    }

    #[test]
    fn raising_the_floor_lets_events_go_and_never_lowers_it() {
        let log = EventLog::new(0);
        for index in 1..=6 {
            log.record(event(index), 10, u64::MAX);
        }
        assert_eq!(indexes(&log.raise_floor(4)), [1, 2, 3, 4]);
        assert_eq!(log.floor(), 4);
        assert_eq!(indexes(&log.resume_from(5, 10).unwrap()), [5, 6]);
        assert!(log.raise_floor(2).is_empty());
        assert_eq!(log.floor(), 4);
        assert_eq!(log.len(), 2);
        log.record(event(3), 10, u64::MAX);
        assert_eq!(log.len(), 2, "an event under the floor is not kept");
    }

    #[test]
    fn retention_behind_a_snapshot_is_bounded_by_count_and_bytes() {
        let log = EventLog::new(0);
        for index in 1..=10 {
            log.record(event(index), 100, u64::MAX);
        }
        assert_eq!(
            log.retention_floor(8, 3, 10_000),
            5,
            "three events behind 8"
        );
        assert_eq!(
            log.retention_floor(8, 6, 250),
            6,
            "two events' bytes behind 8"
        );
        assert_eq!(log.retention_floor(8, 100, 10_000), 0, "all of them");
        assert_eq!(log.retention_floor(2, 1, 50), 2, "not even one fits");
    }

    #[test]
    fn the_oldest_events_go_once_those_kept_exceed_their_budget() {
        let log = EventLog::new(0);
        for index in 1..=10 {
            log.record(event(index), 100, 350);
        }
        assert_eq!(indexes(&log.resume_from(8, 100).unwrap()), [8, 9, 10]);
        assert_eq!(
            log.floor(),
            7,
            "a subscriber needing 7 gets the whole state"
        );
        log.record(event(11), 1_000, 350);
        assert_eq!(
            indexes(&log.resume_from(11, 100).unwrap()),
            [11],
            "the newest stays even when it alone is over"
        );
        assert_eq!(log.raise_floor(11).len(), 1);
        log.record(event(12), 100, 350);
        assert_eq!(
            indexes(&log.resume_from(12, 100).unwrap()),
            [12],
            "the bytes taken out are forgotten"
        );
    }

    #[test]
    fn resuming_under_the_floor_is_refused_rather_than_skipping() {
        let log = EventLog::new(0);
        for index in 1..=5 {
            log.record(event(index), 100, 250);
        }
        assert_eq!(log.floor(), 3);
        assert!(log.resume_from(2, 10).is_none(), "events 2 and 3 are gone");
        assert!(log.resume_from(3, 10).is_none());
        assert_eq!(indexes(&log.resume_from(4, 10).unwrap()), [4, 5]);
    }
}
