//! Which arriving requests the server takes, and when each one's deadline falls.
//!
//! A request is admitted on its arrival, before its body is read, so a full server refuses
//! with a 503 without reading or decoding anything. From then on it holds a place (counted
//! against `maxQueueSize` with the queued ones) until it is queued or released. Its deadline
//! counts from its arrival: the default timeout, replaced by the request's own `timeout`
//! once decoded.
//!
//! Priorities: a full queue still admits a request while the queue holds requests it could
//! shed if it turns out more urgent (queued at a level above 1), at most as many as those;
//! once decoded, [`super::scheduler::Scheduler::shed_for`] decides (`Admissions::placed`).

use std::time::Duration;

use super::Time;
use crate::error::ApiError;

/// Where an admitted request is (the `stage` label of the cancelled requests' counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Its body is being read.
    Reading,
    /// Decoding, or queued.
    Waiting,
    /// In a batch on the engine.
    Running,
}

impl Stage {
    pub fn label(self) -> &'static str {
        match self {
            Stage::Reading => "reading",
            Stage::Waiting => "waiting",
            Stage::Running => "running",
        }
    }
}

/// A request admitted at `arrived_at`.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub arrived_at: Time,
    /// By the default timeout until the request's own replaces it.
    pub deadline: Time,
    pub stage: Stage,
    /// It holds a place (until queued or released).
    pub holds_place: bool,
    /// Admitted past a full queue, on the chance it sheds a less urgent request.
    pub provisional: bool,
}

impl Admission {
    /// The request's own timeout, counted from its arrival like the default.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.deadline = self.arrived_at + timeout;
    }

    /// The answer to a request whose deadline passed in the queue (queued at `queued_at`).
    pub fn expired(&self, now: Time, queued_at: Time) -> ApiError {
        let since_arrival = now.saturating_sub(self.arrived_at).as_secs_f64() * 1000.0;
        let queued = now.saturating_sub(queued_at).as_secs_f64() * 1000.0;
        ApiError::DeadlineExceeded(format!(
            "the request's deadline passed {since_arrival:.1} ms after it arrived, {queued:.1} ms of \
             them in the queue; it was not executed"
        ))
    }
}

/// Admits requests while open, up to `max_queue_size` admitted and not yet running.
#[derive(Clone, Debug)]
pub struct Admissions {
    max_queue_size: usize,
    default_timeout: Duration,
    accepting: bool,
    draining: bool,
    /// Admitted and not yet queued, provisional ones included.
    unqueued: usize,
    /// Of those, admitted past a full queue: they hold no place of their own.
    provisional: usize,
}

impl Admissions {
    pub fn new(max_queue_size: usize, default_timeout: Duration) -> Self {
        Admissions {
            max_queue_size,
            default_timeout,
            accepting: false,
            draining: false,
            unqueued: 0,
            provisional: 0,
        }
    }

    pub fn open(&mut self) {
        self.accepting = true;
    }

    /// Refuses every later request; `draining`: a shutdown (those admitted still run).
    /// A stop after a drain is still a shutdown.
    pub fn stop(&mut self, draining: bool) {
        self.accepting = false;
        self.draining = self.draining || draining;
    }

    pub fn accepting(&self) -> bool {
        self.accepting
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Admitted and not yet queued (their bodies read or decoded).
    pub fn unqueued(&self) -> usize {
        self.unqueued
    }

    /// Admits one request arriving at `now`: a 503 when not open (NotReady: "not started"
    /// or "the server is shutting down"), when the engine has been stuck for `stuck_for`
    /// (NotReady naming how long), or when `queued` plus the unqueued fill maxQueueSize and
    /// no more than the provisional admissions already taken could be placed by shedding
    /// (`sheddable`: queued requests at a level above 1) (Overloaded).
    pub fn admit(
        &mut self,
        now: Time,
        queued: usize,
        sheddable: usize,
        stuck_for: Option<Duration>,
    ) -> Result<Admission, ApiError> {
        if !self.accepting {
            let why = if self.draining {
                "the server is shutting down"
            } else {
                "not started"
            };
            return Err(ApiError::NotReady(why.into()));
        }
        if let Some(stuck) = stuck_for {
            return Err(ApiError::NotReady(format!(
                "the engine has not returned a batch for {:.1} s; retry later",
                stuck.as_secs_f64()
            )));
        }
        // Provisional admissions hold no place: a request admitted with one keeps it.
        let provisional = !self.fits(queued);
        if provisional {
            if self.provisional >= sheddable {
                return Err(self.full_queue());
            }
            self.provisional += 1;
        }
        self.unqueued += 1;
        Ok(Admission {
            arrived_at: now,
            deadline: now + self.default_timeout,
            stage: Stage::Reading,
            holds_place: true,
            provisional,
        })
    }

    /// Gives back the place of a request (queued now, or ended before); idempotent.
    pub fn release(&mut self, admission: &mut Admission) {
        if admission.holds_place {
            admission.holds_place = false;
            self.unqueued -= 1;
            if admission.provisional {
                self.provisional -= 1;
            }
        }
    }

    /// Whether a decoded request fits the queue as it stands (`queued` requests queued),
    /// this one's place released first: false means it must shed a less urgent one
    /// (`Scheduler::shed_for`) or be refused.
    pub fn fits(&self, queued: usize) -> bool {
        // The places held: the unqueued admissions but the provisional ones.
        queued + (self.unqueued - self.provisional) < self.max_queue_size
    }

    /// The 503 of a request refused for a full queue.
    pub fn full_queue(&self) -> ApiError {
        ApiError::Overloaded(format!(
            "the queue is full ({} requests); retry later",
            self.max_queue_size
        ))
    }
}

#[cfg(test)]
mod tests;
