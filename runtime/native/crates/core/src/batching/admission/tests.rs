//! Covers, as the Python admission rules (`tests/runtime/test_batch_admission_rules.py`):
//! nothing is admitted before opening nor once stopped (draining says so); a stuck engine
//! refuses with how long; maxQueueSize counts queued and unqueued requests; a place is
//! given back once; deadlines count from arrival; an expired answer says where the time
//! went. Then priorities: a full queue admits provisionally as many as it could shed.

use super::*;

fn s(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds)
}

fn admissions(max_queue_size: usize) -> Admissions {
    let mut gate = Admissions::new(max_queue_size, Duration::from_millis(2000));
    gate.open();
    gate
}

#[test]
fn nothing_is_admitted_before_opening_nor_once_stopped() {
    let mut gate = Admissions::new(3, s(2.0));
    assert!(!gate.accepting() && !gate.draining());
    assert_eq!(
        gate.admit(s(0.0), 0, 0, None),
        Err(ApiError::NotReady("not started".into()))
    );
    gate.open();
    gate.stop(true);
    let refused = gate.admit(s(0.0), 0, 0, None).unwrap_err();
    assert_eq!(
        refused,
        ApiError::NotReady("the server is shutting down".into())
    );
    gate.stop(false); // closing after a drain: still a shutdown
    assert!(gate.draining());
    let mut stopped = admissions(3);
    stopped.stop(false);
    assert!(!stopped.draining());
    assert_eq!(
        stopped.admit(s(0.0), 0, 0, None).unwrap_err().message(),
        "not started"
    );
    assert_eq!(gate.unqueued(), 0);
}

#[test]
fn a_stuck_engine_refuses_saying_for_how_long() {
    let refused = admissions(3)
        .admit(s(12.5), 0, 0, Some(s(2.5)))
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "the engine has not returned a batch for 2.5 s; retry later"
    );
    assert_eq!(refused.status(), 503);
}

#[test]
fn the_queue_bound_counts_queued_and_unqueued_requests() {
    for (queued, unqueued, admitted) in [
        (0, 0, true),
        (2, 0, true),
        (0, 2, true),
        (1, 1, true),
        (3, 0, false),
        (1, 2, false),
    ] {
        let mut gate = admissions(3);
        for _ in 0..unqueued {
            gate.admit(s(0.0), 0, 0, None).unwrap();
        }
        let result = gate.admit(s(0.0), queued, 0, None);
        if admitted {
            assert!(!result.unwrap().provisional);
            assert_eq!(gate.unqueued(), unqueued + 1);
        } else {
            let refused = result.unwrap_err();
            assert_eq!(
                refused.message(),
                "the queue is full (3 requests); retry later"
            );
            assert_eq!(refused.retry_after_seconds(), Some(1));
            assert_eq!(gate.unqueued(), unqueued);
        }
    }
}

#[test]
fn a_place_is_given_back_once() {
    let mut gate = admissions(3);
    let mut first = gate.admit(s(0.0), 0, 0, None).unwrap();
    let second = gate.admit(s(0.0), 0, 0, None).unwrap();
    gate.release(&mut first);
    gate.release(&mut first);
    assert!(gate.unqueued() == 1 && !first.holds_place && second.holds_place);
}

#[test]
fn the_deadline_counts_from_arrival() {
    let mut admission = admissions(3).admit(s(100.0), 0, 0, None).unwrap();
    assert_eq!(
        (admission.arrived_at, admission.deadline),
        (s(100.0), s(102.0))
    );
    assert_eq!(admission.stage.label(), "reading");
    admission.set_timeout(s(0.5));
    assert_eq!(admission.deadline, s(100.5));
}

#[test]
fn an_expired_request_is_told_where_its_time_went() {
    let admission = admissions(3).admit(s(100.0), 0, 0, None).unwrap();
    let answer = admission.expired(s(101.5), s(101.0));
    assert_eq!(answer.status(), 504);
    assert_eq!(
        answer.message(),
        "the request's deadline passed 1500.0 ms after it arrived, 500.0 ms of them in the queue; \
         it was not executed"
    );
}

#[test]
fn a_full_queue_admits_provisionally_as_many_as_it_could_shed() {
    let mut gate = admissions(2);
    // Two queued, both sheddable: two provisional admissions, not a third.
    let mut first = gate.admit(s(0.0), 2, 2, None).unwrap();
    let second = gate.admit(s(0.0), 2, 2, None).unwrap();
    assert!(first.provisional && second.provisional);
    assert!(gate.admit(s(0.0), 2, 2, None).is_err());
    // Nothing sheddable: refused outright.
    assert!(admissions(2).admit(s(0.0), 2, 0, None).is_err());
    // Once decoded, a provisional request does not fit: it must shed.
    gate.release(&mut first);
    assert!(!gate.fits(2));
    assert!(gate.admit(s(0.0), 2, 2, None).unwrap().provisional);
}

#[test]
fn provisional_admissions_take_no_place_from_those_admitted_before() {
    let mut gate = admissions(3);
    let mut placed = gate.admit(s(0.0), 2, 2, None).unwrap(); // the last place
    assert!(!placed.provisional);
    let mut extra = gate.admit(s(0.0), 2, 2, None).unwrap();
    assert!(extra.provisional);
    gate.release(&mut placed);
    assert!(gate.fits(2), "its place was kept for it");
    gate.release(&mut extra);
    assert_eq!(gate.unqueued(), 0);
    assert!(!gate.fits(3));
}
