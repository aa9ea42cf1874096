//! One infer request's accounting, ended exactly once however its handler ends: answered
//! (counted by code, its duration observed), or dropped because its client left (counted
//! cancelled at the stage it had reached); in progress from its admission to its end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataplane_core::batching::admission::Stage;

use super::registry_lock;
use crate::state::{Reply, Shared};

/// What is known of the request so far.
struct Seen {
    admitted: bool,
    stage: Stage,
    /// Its answer's place once queued (to tell whether its batch is on a slot).
    reply: Option<Arc<Reply>>,
    /// Its client left mid-body.
    left: bool,
    ended: bool,
}

/// Made as an infer request arrives; the handler tells it each step (one call each) and
/// [`RequestWatch::answered`] at the end. Dropped unanswered (the client left and the
/// handler's future was dropped), it counts the request cancelled.
pub struct RequestWatch<'a> {
    shared: &'a Shared,
    seen: Mutex<Seen>,
}

impl<'a> RequestWatch<'a> {
    /// A request arriving (not yet admitted: a refusal is answered, never in progress).
    pub fn new(shared: &'a Shared) -> RequestWatch<'a> {
        RequestWatch {
            shared,
            seen: Mutex::new(Seen {
                admitted: false,
                stage: Stage::Reading,
                reply: None,
                left: false,
                ended: false,
            }),
        }
    }

    /// Admitted: in progress from now on (its body is being read).
    pub fn admitted(&self) {
        registry_lock(&self.seen).admitted = true;
        self.shared.metrics.request_started();
    }

    /// Its body is read: decoding, then queued.
    pub fn waiting(&self) {
        registry_lock(&self.seen).stage = Stage::Waiting;
    }

    /// Its client left while sending the body: whatever is answered reaches nobody.
    pub fn client_left(&self) {
        registry_lock(&self.seen).left = true;
    }

    /// Queued, its answer to come through `reply`.
    pub fn queued(&self, reply: &Arc<Reply>) {
        registry_lock(&self.seen).reply = Some(reply.clone());
    }

    /// Answered with `code`, `seconds` after it arrived (unless its client left: then
    /// it is counted cancelled as it drops).
    pub fn answered(self, code: u16, seconds: Duration) {
        let mut seen = registry_lock(&self.seen);
        if !seen.left {
            self.shared.metrics.request_answered(code, seconds);
            seen.ended = true;
        }
        // Drop ends its time in progress.
    }

    /// Where the request is: running once its batch is on a slot.
    fn stage_now(&self, seen: &Seen) -> Stage {
        let Some(reply) = &seen.reply else {
            return seen.stage;
        };
        let core = self.shared.core();
        let running = core
            .running
            .values()
            .any(|replies| replies.iter().any(|r| Arc::ptr_eq(r, reply)));
        if running { Stage::Running } else { seen.stage }
    }
}

impl Drop for RequestWatch<'_> {
    fn drop(&mut self) {
        let seen = registry_lock(&self.seen);
        if !seen.admitted {
            return;
        }
        if !seen.ended {
            let stage = self.stage_now(&seen);
            self.shared.metrics.request_cancelled(stage.label());
        }
        self.shared.metrics.request_finished();
    }
}
