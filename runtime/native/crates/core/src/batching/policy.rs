//! When to run a batch: the flush rules of the dynamic batcher, as a pure function (a port
//! of `runtime/batching/policy.py`'s `next_decision`, its rules 1-4). The queue comes
//! ordered by priority level, then by the time each request was queued; rule 5 (inline
//! batches) and the company turns of rule 3 were the Python event loop's and do not apply.
//!
//! The rules, in order:
//!
//! 1. A batch never exceeds `maxBatchSize` rows; a request carrying its own batch dimension
//!    counts by its rows and is never split. A batch holds requests of one batch shape: the
//!    first queued request's, with the requests of that shape after it, in order, while
//!    they fit; the others keep their places for the next batch.
//! 2. With no free slot nothing runs: requests keep queueing, which is how batches form
//!    while execution is busy.
//! 3. When a slot is free the queued requests go at once, up to `maxBatchSize`, unless
//!    waiting (up to `maxQueueDelayMicroseconds` after the batch's longest-queued request
//!    was queued) can help: another batch is in flight (so requests are arriving, and a
//!    small batch started now would compete with it for the same cores or GPU) and a
//!    better size is still ahead, the next of `preferredBatchSizes` or, when none is
//!    configured, `maxBatchSize`. Reaching a preferred size, or passing the largest one,
//!    flushes at once. With no batch in flight nothing waits, so a lone request on an idle
//!    server pays no delay. Requests of another shape waiting behind flush it at once too.
//!    A wait never reaches a queued request's deadline (one woken at its deadline has
//!    expired): a batch with a member whose deadline comes by the end of the delay goes at
//!    once. (The Python policy waited until that deadline, and the request expired.)
//! 4. While draining nothing waits: everything queued goes as fast as slots free up.
//!
//! A request whose deadline is now or past is expired: reported, never run, and left out.

use std::time::Duration;

use super::{BatchShape, Time};

/// What the policy needs to know about one queued request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pending<'a> {
    pub rows: usize,
    /// When it was queued: the queue delay counts from here.
    pub queued_at: Time,
    pub deadline: Time,
    /// The batch shape it joins (rule 1); None for a model without variable axes.
    pub shape: Option<&'a BatchShape>,
}

/// The values the flush rules read: the configured ones, or the adaptive setting's delay
/// and preferred size.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    pub max_batch_size: usize,
    pub max_queue_delay: Duration,
    /// Sorted and unique.
    pub preferred_batch_sizes: Vec<usize>,
}

/// Run the requests at `members` (positions in the queue handed to [`next_decision`], in
/// order) as one batch of `rows` rows now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flush {
    pub members: Vec<usize>,
    pub rows: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Flush(Flush),
    /// Nothing to run before this time; None: before the next event (a request queued, a
    /// slot freed).
    WaitUntil(Option<Time>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Positions of the requests past their deadline: answer them, never run them.
    pub expired: Vec<usize>,
    pub action: Action,
}

/// The batcher's next step; see the module's rules.
pub fn next_decision(
    rules: &Rules,
    pending: &[Pending<'_>],
    free_slots: usize,
    busy_slots: usize,
    now: Time,
    draining: bool,
) -> Decision {
    let expired: Vec<usize> = (0..pending.len())
        .filter(|&i| pending[i].deadline <= now)
        .collect();
    let live: Vec<usize> = (0..pending.len())
        .filter(|&i| pending[i].deadline > now)
        .collect();
    let earliest_deadline = live.iter().map(|&i| pending[i].deadline).min();
    if live.is_empty() || free_slots == 0 {
        return Decision {
            expired,
            action: Action::WaitUntil(earliest_deadline),
        };
    }
    let flush = batch_of_first(pending, &live, rules.max_batch_size);
    let rows = flush.rows;
    let oldest = flush
        .members
        .iter()
        .map(|&i| pending[i].queued_at)
        .min()
        .unwrap_or(now);
    let whole_queue = flush.members.len() == live.len();
    let flush_at = oldest + rules.max_queue_delay;
    // Waiting for the whole queue, whose earliest deadline is then a member's: a request
    // woken at its deadline has expired, so a wait that would reach it goes now instead.
    let wait_reaches_a_deadline = earliest_deadline.is_some_and(|d| d <= flush_at);
    let flush_now = !whole_queue
        || rows >= rules.max_batch_size
        || draining
        || busy_slots == 0
        || !better_size_ahead(&rules.preferred_batch_sizes, rows)
        || now >= flush_at
        || wait_reaches_a_deadline;
    let action = if flush_now {
        Action::Flush(flush)
    } else {
        Action::WaitUntil(Some(flush_at))
    };
    Decision { expired, action }
}

/// Whether waiting can reach a better size than `rows`: a preferred size above it (rows
/// at a preferred size, or past the largest, flush), or maxBatchSize when none is
/// configured (the caller flushes at maxBatchSize already).
fn better_size_ahead(preferred: &[usize], rows: usize) -> bool {
    match preferred.last() {
        None => true,
        Some(&largest) => !preferred.contains(&rows) && rows < largest,
    }
}

/// Rule 1: the batch the first live request starts, and its rows. At least that one:
/// a request larger than maxBatchSize (admission refuses those) still runs, alone.
fn batch_of_first(pending: &[Pending<'_>], live: &[usize], max_batch_rows: usize) -> Flush {
    let shape = pending[live[0]].shape;
    let mut flush = Flush {
        members: Vec::new(),
        rows: 0,
    };
    for &position in live {
        let request = &pending[position];
        if request.shape != shape {
            continue;
        }
        if flush.rows + request.rows > max_batch_rows && !flush.members.is_empty() {
            break;
        }
        flush.rows += request.rows;
        flush.members.push(position);
    }
    flush
}

#[cfg(test)]
mod tests;
