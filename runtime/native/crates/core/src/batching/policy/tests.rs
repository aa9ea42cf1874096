//! Covers, as the Python policy's table (`tests/runtime/test_batching_policy.py`) on a
//! hand-set clock: a lone request on an idle server runs at once; nothing runs without a
//! free slot; a free slot takes the queue at once up to maxBatchSize; requests carrying
//! their own batch dimension count by rows and are never split; waiting (up to the delay
//! after the longest-queued request, never up to a deadline) happens only while another
//! batch runs and a better size is ahead; expired requests are reported and left out;
//! draining never waits. Then the shapes' grouping, and the invariants over random queues.

use super::*;
use crate::batching::seeded::Seeded;

const FAR: Time = Duration::from_secs(1_000_000);

fn us(micros: u64) -> Time {
    Duration::from_micros(micros)
}

fn p(rows: usize, queued_us: u64, deadline: Time) -> Pending<'static> {
    Pending {
        rows,
        queued_at: us(queued_us),
        deadline,
        shape: None,
    }
}

fn one() -> Pending<'static> {
    p(1, 0, FAR)
}

fn rules(preferred: &[usize], delay_us: u64, max_batch: usize) -> Rules {
    Rules {
        max_batch_size: max_batch,
        max_queue_delay: us(delay_us),
        preferred_batch_sizes: preferred.to_vec(),
    }
}

fn default_rules() -> Rules {
    rules(&[], 1000, 8)
}

fn flush(members: impl IntoIterator<Item = usize>, rows: usize) -> Action {
    Action::Flush(Flush {
        members: members.into_iter().collect(),
        rows,
    })
}

fn wait(at: Option<Time>) -> Action {
    Action::WaitUntil(at)
}

struct Case {
    name: &'static str,
    rules: Rules,
    pending: Vec<Pending<'static>>,
    free: usize,
    busy: usize,
    now: Time,
    draining: bool,
    expired: Vec<usize>,
    action: Action,
}

fn case(
    name: &'static str,
    rules: Rules,
    pending: Vec<Pending<'static>>,
    free: usize,
    busy: usize,
) -> Case {
    Case {
        name,
        rules,
        pending,
        free,
        busy,
        now: us(0),
        draining: false,
        expired: vec![],
        action: wait(None),
    }
}

impl Case {
    fn at(mut self, now: Time) -> Self {
        self.now = now;
        self
    }
    fn draining(mut self) -> Self {
        self.draining = true;
        self
    }
    fn expect(mut self, expired: Vec<usize>, action: Action) -> Self {
        self.expired = expired;
        self.action = action;
        self
    }
}

fn cases() -> Vec<Case> {
    let s = Duration::from_secs;
    vec![
        case(
            "an empty queue waits for the next event",
            default_rules(),
            vec![],
            2,
            0,
        )
        .expect(vec![], wait(None)),
        case(
            "a lone request on an idle server runs at once",
            default_rules(),
            vec![one()],
            2,
            0,
        )
        .expect(vec![], flush([0], 1)),
        case(
            "a lone request on an idle server runs at once even below a preferred size",
            rules(&[4, 8], 1000, 8),
            vec![one()],
            2,
            0,
        )
        .expect(vec![], flush([0], 1)),
        case(
            "without a free slot requests keep queueing until the earliest deadline",
            default_rules(),
            vec![p(1, 0, s(5)), p(1, 0, s(3))],
            0,
            2,
        )
        .at(s(1))
        .expect(vec![], wait(Some(s(3)))),
        case(
            "with one slot, the free slot takes everything queued at once",
            default_rules(),
            vec![one(), one(), one()],
            1,
            0,
        )
        .expect(vec![], flush(0..3, 3)),
        case(
            "a queue longer than maxBatchSize sends maxBatchSize at once, even while busy",
            default_rules(),
            vec![one(); 10],
            1,
            1,
        )
        .expect(vec![], flush(0..8, 8)),
        case(
            "a request with its own batch dimension counts by rows and is never split",
            default_rules(),
            vec![p(5, 0, FAR), p(4, 0, FAR)],
            1,
            1,
        )
        .expect(vec![], flush([0], 5)),
        case(
            "a request larger than maxBatchSize still runs alone",
            default_rules(),
            vec![p(9, 0, FAR), one()],
            1,
            0,
        )
        .expect(vec![], flush([0], 9)),
        case(
            "requests whose rows add up to maxBatchSize go at once",
            default_rules(),
            vec![p(3, 0, FAR), p(5, 0, FAR)],
            1,
            1,
        )
        .expect(vec![], flush([0, 1], 8)),
        case(
            "while another batch runs, a small batch waits for more until the delay",
            default_rules(),
            vec![p(1, 0, FAR), p(1, 200, FAR)],
            1,
            1,
        )
        .at(us(500))
        .expect(vec![], wait(Some(us(1000)))),
        case(
            "once the oldest request has waited the delay, the batch goes",
            default_rules(),
            vec![p(1, 0, FAR), p(1, 200, FAR)],
            1,
            1,
        )
        .at(us(1000))
        .expect(vec![], flush([0, 1], 2)),
        case(
            "reaching a preferred size flushes at once while another batch runs",
            rules(&[4], 1000, 8),
            vec![one(); 4],
            1,
            1,
        )
        .expect(vec![], flush(0..4, 4)),
        case(
            "between preferred sizes the batcher waits for the next one",
            rules(&[2, 4], 1000, 8),
            vec![one(); 3],
            1,
            1,
        )
        .expect(vec![], wait(Some(us(1000)))),
        case(
            "past the largest preferred size waiting cannot help: flush",
            rules(&[2, 4], 1000, 8),
            vec![one(); 5],
            1,
            1,
        )
        .expect(vec![], flush(0..5, 5)),
        case(
            "a request whose deadline comes within the delay goes at once, not to expire waiting",
            rules(&[4], 1000, 8),
            vec![p(1, 0, us(600))],
            1,
            1,
        )
        .expect(vec![], flush([0], 1)),
        case(
            "a deadline at the end of the delay is reached by the wait: at once too",
            rules(&[4], 1000, 8),
            vec![p(1, 0, FAR), p(1, 0, us(1000))],
            1,
            1,
        )
        .expect(vec![], flush([0, 1], 2)),
        case(
            "a deadline after the delay lets the batch wait the delay",
            rules(&[4], 1000, 8),
            vec![p(1, 0, us(1001))],
            1,
            1,
        )
        .expect(vec![], wait(Some(us(1000)))),
        case(
            "a request past its deadline is expired and left out of the batch",
            default_rules(),
            vec![p(1, 0, us(500_000)), p(1, 0, s(10))],
            1,
            0,
        )
        .at(s(1))
        .expect(vec![0], flush([1], 1)),
        case(
            "a deadline equal to now has passed",
            default_rules(),
            vec![p(1, 0, s(1))],
            1,
            0,
        )
        .at(s(1))
        .expect(vec![0], wait(None)),
        case(
            "expired requests are reported even when no slot is free",
            default_rules(),
            vec![p(1, 0, us(500_000)), p(1, 0, s(4))],
            0,
            2,
        )
        .at(s(1))
        .expect(vec![0], wait(Some(s(4)))),
        case(
            "while draining nothing waits",
            rules(&[4], 1000, 8),
            vec![one()],
            1,
            1,
        )
        .draining()
        .expect(vec![], flush([0], 1)),
        case(
            "a zero queue delay never waits",
            rules(&[], 0, 8),
            vec![one()],
            1,
            1,
        )
        .expect(vec![], flush([0], 1)),
        case(
            "the delay counts from the longest-queued member, whatever its place",
            default_rules(),
            vec![p(1, 900, FAR), p(1, 100, FAR)],
            1,
            1,
        )
        .at(us(1000))
        .expect(vec![], wait(Some(us(1100)))),
    ]
}

#[test]
fn the_decision_table() {
    for case in cases() {
        let decision = next_decision(
            &case.rules,
            &case.pending,
            case.free,
            case.busy,
            case.now,
            case.draining,
        );
        let expected = Decision {
            expired: case.expired,
            action: case.action,
        };
        assert_eq!(decision, expected, "{}", case.name);
    }
}

fn shaped<'a>(shape: Option<&'a BatchShape>, rows: usize) -> Pending<'a> {
    Pending {
        rows,
        queued_at: us(0),
        deadline: FAR,
        shape,
    }
}

#[test]
fn a_batch_takes_the_first_requests_shape_and_the_others_keep_their_places() {
    let (a, b): (BatchShape, BatchShape) = (vec![vec![16]], vec![vec![32]]);
    let (a, b) = (Some(&a), Some(&b));
    let table: Vec<(Vec<Option<&BatchShape>>, Action)> = vec![
        (vec![None, None, None], flush(0..3, 3)),
        (vec![a, a, a], flush(0..3, 3)),
        (vec![a, b, a], flush([0, 2], 2)),
        (vec![b, a, a, b], flush([0, 3], 2)),
        (vec![a, b], flush([0], 1)),
    ];
    for (shapes, expected) in table {
        let queue: Vec<Pending> = shapes.iter().map(|s| shaped(*s, 1)).collect();
        let decision = next_decision(&default_rules(), &queue, 1, 0, us(1000), false);
        assert_eq!(decision.action, expected, "{shapes:?}");
    }
    // One shape's batch stops at maxBatchSize.
    let queue = [shaped(a, 3), shaped(b, 1), shaped(a, 3), shaped(a, 3)];
    let decision = next_decision(&rules(&[], 1000, 6), &queue, 1, 0, us(1000), false);
    assert_eq!(decision.action, flush([0, 2], 6));
    // A slot busy and a better size ahead: one shape alone waits, two shapes do not.
    let patient = rules(&[], 10_000, 8);
    let alone = next_decision(
        &patient,
        &[shaped(a, 1), shaped(a, 1)],
        1,
        1,
        us(1000),
        false,
    );
    assert!(
        matches!(alone.action, Action::WaitUntil(Some(_))),
        "{alone:?}"
    );
    let mixed = next_decision(
        &patient,
        &[shaped(a, 1), shaped(b, 1)],
        1,
        1,
        us(1000),
        false,
    );
    assert_eq!(mixed.action, flush([0], 1));
}

#[test]
fn invariants_over_random_queues() {
    let mut random = Seeded::new(0x9E37_79B9_7F4A_7C15);
    for _ in 0..2000 {
        let length = random.below(40) as usize;
        let queue: Vec<Pending> = (0..length)
            .map(|_| {
                p(
                    1 + random.below(8) as usize,
                    random.below(1_000_000),
                    us(random.below(2_000_000)),
                )
            })
            .collect();
        let preferred: Vec<usize> = {
            let mut sizes: Vec<usize> = (0..random.below(4))
                .map(|_| 1 + random.below(8) as usize)
                .collect();
            sizes.sort_unstable();
            sizes.dedup();
            sizes
        };
        let (free, busy) = (random.below(4) as usize, random.below(4) as usize);
        let now = us(random.below(2_000_000));
        let rules = rules(&preferred, 1000, 8);
        let decision = next_decision(&rules, &queue, free, busy, now, random.below(2) == 1);
        let expired: Vec<usize> = (0..length).filter(|&i| queue[i].deadline <= now).collect();
        assert_eq!(decision.expired, expired);
        let live: Vec<usize> = (0..length).filter(|&i| queue[i].deadline > now).collect();
        match decision.action {
            Action::Flush(flush) => {
                assert!(free > 0 && !flush.members.is_empty());
                assert_eq!(
                    flush.members,
                    live[..flush.members.len()].to_vec(),
                    "a prefix of the live"
                );
                assert_eq!(
                    flush.rows,
                    flush.members.iter().map(|&i| queue[i].rows).sum::<usize>()
                );
                assert!(flush.rows <= 8);
            }
            Action::WaitUntil(at) => {
                assert!(live.is_empty() || free == 0 || busy > 0);
                if let Some(earliest) = live.iter().map(|&i| queue[i].deadline).min() {
                    assert!(at.is_some_and(|at| at <= earliest && at > now));
                    // Held back with a slot free: woken before any deadline comes.
                    assert!(free == 0 || at.is_some_and(|at| at < earliest));
                }
            }
        }
    }
}
