//! Mirroring on the Rust data plane: which answered requests go to the embedding side's
//! mirrors (a shadow candidate, a quality watch's reference), decided here per request,
//! and their hand-over, once per batch.
//!
//! The embedding side follows the mirror target file and runs the mirrors (their queues,
//! sends, comparisons and figures: `kubeinfer.runtime.shadow`); it tells the server which
//! roles mirror at which share ([`Mirroring`], through [`crate::Server::set_mirroring`]).
//! Each role has its own [`Sampler`], made anew whenever the role's mirror is (its `token`
//! changes), as the Python mirror makes one per target. Every request a batch answers is
//! counted for the roles, and the sampled ones are handed to the [`Mirror`] with their
//! inputs, outputs, server time and the watch's slice header's value
//! ([`MirroredBatch`]): from the slot's thread, after the batch's answers were sent, and
//! while the slot still holds what it ran the batch with (the Python slot: the GIL), so
//! the hand-over costs no crossing of its own.

use dataplane_core::tensor::Tensor;

use crate::driver::Job;
use crate::state::{Answer, Shared, lock};

#[cfg(test)]
mod tests;

/// Which requests are mirrored: exactly `percent` of every hundred, the first taken
/// (`kubeinfer.runtime.shadow.sampling.Sampler`'s credit accumulator: deterministic, no
/// random draw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampler {
    percent: u32,
    credit: u32,
}

impl Sampler {
    /// A sampler of `percent` (0..=100) of requests.
    pub fn new(percent: u32) -> Result<Sampler, String> {
        if percent > 100 {
            return Err(format!("percent {percent} is outside 0..100"));
        }
        Ok(Sampler {
            percent,
            credit: 100 - percent,
        })
    }

    /// Whether this request is taken.
    pub fn take(&mut self) -> bool {
        self.credit += self.percent;
        if self.credit >= 100 {
            self.credit -= 100;
            return true;
        }
        false
    }
}

/// One role the embedding side mirrors to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorRole {
    /// The role's name (`shadow`, `quality`), handed back with each sampled request.
    pub role: String,
    /// The share of answered requests it takes (its target's trafficPercent).
    pub percent: u32,
    /// Names the role's current mirror: another token, another mirror, a fresh sampler.
    pub token: u64,
}

/// What is mirrored: the roles, and the header a quality watch reads each request's
/// slice from (None: read none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mirroring {
    pub roles: Vec<MirrorRole>,
    pub slice_header: Option<String>,
}

/// A sampled request, as it is handed over.
#[derive(Clone, Debug)]
pub struct MirroredRequest {
    /// Its inputs as it sent them (checked, in the model's input order).
    pub inputs: Vec<Tensor>,
    /// Its rows of every output, in the model's output order.
    pub outputs: Vec<Tensor>,
    /// Its server time, from its arrival to its answer.
    pub server_seconds: f64,
    /// The raw value of the watch's slice header, when it had one.
    pub slice_value: Option<String>,
    /// The roles that sampled it (indices into [`MirroredBatch::roles`]).
    pub roles: Vec<usize>,
}

/// One batch's hand-over.
#[derive(Clone, Debug)]
pub struct MirroredBatch {
    /// The roles mirrored to when the batch was answered.
    pub roles: Vec<String>,
    /// The batch's requests answered (sampled or not), counted for every role.
    pub answered: usize,
    /// The sampled ones.
    pub requests: Vec<MirroredRequest>,
}

/// What takes each batch's mirrored requests (the embedding side's mirrors). Called on a
/// slot's thread, inside the batch's run: it must only hand them on (to a queue, a loop
/// of its own) and never fail or wait.
pub trait Mirror: Send + Sync {
    fn hand_over(&self, batch: MirroredBatch);
}

/// A sampled request: its index among the batch's answered ones, and the roles (their
/// indices) that took it.
pub type Taken = (usize, Vec<usize>);

struct Role {
    role: MirrorRole,
    sampler: Sampler,
}

/// The roles' samplers (behind a lock taken once per batch).
#[derive(Default)]
pub struct Samplers {
    state: std::sync::Mutex<(Vec<Role>, Option<String>)>,
}

impl Samplers {
    /// Mirrors as `mirroring` says from the next batch on: a role whose token is the one
    /// it had keeps its sampler (its credit), any other gets a fresh one. Refuses a
    /// share above 100, changing nothing.
    pub fn set(&self, mirroring: Mirroring) -> Result<(), String> {
        let mut state = lock(&self.state);
        let mut roles = Vec::with_capacity(mirroring.roles.len());
        for role in mirroring.roles {
            let kept = (state.0.iter())
                .find(|r| r.role.role == role.role && r.role.token == role.token)
                .filter(|r| r.role.percent == role.percent)
                .map(|r| r.sampler.clone());
            let sampler = match kept {
                Some(sampler) => sampler,
                None => Sampler::new(role.percent)?,
            };
            roles.push(Role { role, sampler });
        }
        *state = (roles, mirroring.slice_header);
        Ok(())
    }

    /// The header to read a request's slice from (None: none, or nothing mirrored).
    pub fn slice_header(&self) -> Option<String> {
        let state = lock(&self.state);
        if state.0.is_empty() {
            return None;
        }
        state.1.clone()
    }

    /// Whether any role mirrors.
    pub fn active(&self) -> bool {
        !lock(&self.state).0.is_empty()
    }

    /// Samples a batch's answered requests, each role on its own sampler: the requests
    /// taken by any role (their index in `answered`, and the roles that took them), and
    /// the roles' names. None while nothing is mirrored.
    pub fn sample(&self, answered: usize) -> Option<(Vec<String>, Vec<Taken>)> {
        let mut state = lock(&self.state);
        let roles = &mut state.0;
        if roles.is_empty() {
            return None;
        }
        let mut taken = Vec::new();
        for index in 0..answered {
            let by: Vec<usize> = (roles.iter_mut().enumerate())
                .filter_map(|(i, role)| role.sampler.take().then_some(i))
                .collect();
            if !by.is_empty() {
                taken.push((index, by));
            }
        }
        let names = roles.iter().map(|r| r.role.role.clone()).collect();
        Some((names, taken))
    }
}

/// Sends each member of `batch` its answer; while something is mirrored, also samples the
/// members answered (those whose client still waited) and returns the batch's hand-over
/// (None: nothing mirrored, or nothing answered).
pub fn answer_mirrored(
    shared: &Shared,
    batch: &Job,
    answers: Vec<Answer>,
) -> Option<MirroredBatch> {
    if !shared.samplers.active() {
        for (member, answer) in batch.members.iter().zip(answers) {
            member.payload.reply.send(answer);
        }
        return None;
    }
    let mut delivered = Vec::with_capacity(answers.len());
    for (member, answer) in batch.members.iter().zip(answers) {
        let kept = answer.as_ref().ok().cloned();
        if member.payload.reply.send(answer) {
            let seconds = shared.now().saturating_sub(member.arrived_at);
            if let Some(outputs) = kept {
                delivered.push((member, outputs, seconds.as_secs_f64()));
            }
        }
    }
    let (roles, taken) = shared.samplers.sample(delivered.len())?;
    if delivered.is_empty() {
        return None;
    }
    let answered = delivered.len();
    let mut delivered: Vec<Option<_>> = delivered.into_iter().map(Some).collect();
    let requests = taken
        .into_iter()
        .filter_map(|(index, by)| {
            let (member, outputs, server_seconds) = delivered[index].take()?;
            Some(MirroredRequest {
                inputs: member.payload.inputs.clone(),
                outputs,
                server_seconds,
                slice_value: member.payload.slice_value.clone(),
                roles: by,
            })
        })
        .collect();
    Some(MirroredBatch {
        roles,
        answered,
        requests,
    })
}
