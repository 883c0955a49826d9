//! The store in process memory: every record under one lock, ended ones forgotten after the retention, and
//! the last events kept for streams that reconnect.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::Implementation;
use serde_json::Map;

use super::shares::{Held, Running, Shares};
use super::{
    Answered, Asked, EventPage, Finished, Horizons, InsertCallError, InsertSessionError, Lease, NewCall, NewRequest,
    NewRound, NewSession, Pending, PendingCaps, RaiseError, Recovered, Resolution, Resolved, Retry, Started,
    StoreError,
};
use crate::audit::Link;
use crate::decision::{self, Proposal, Upstream};
use crate::feed::Feed;
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::json_size;
use crate::records::{
    Allowed, Arguments, CallFilter, CallStatus, CallTask, CallView, Event, EventKind, Filter, Finish, RequestView,
    SessionFilter, SessionStatus, SessionView, Status,
};
use crate::retained::Retained;
use crate::time::{Clock, Timestamp};

mod audit;
mod calls;
mod grants;
mod requests;

/// How many past events a reconnecting stream (or a webhook that fell behind) can catch up on.
pub const REPLAY_CAPACITY: usize = 4096;
/// The most bytes of event data kept for replay.
const REPLAY_BYTES: usize = 32 << 20;
/// What ended calls may hold (their arguments and results) in all, and per principal: past it the oldest
/// ended calls are forgotten before their retention ends.
const ENDED_CALLS: Held = Held {
    count: 100_000,
    bytes: 64 << 20,
};
const ENDED_CALLS_PER_PRINCIPAL: Held = Held {
    count: 25_000,
    bytes: 16 << 20,
};

/// The memory store; cheap to clone.
#[derive(Debug, Clone)]
pub struct Memory {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    feed: Feed,
    clock: Clock,
}

#[derive(Debug, Default)]
struct State {
    /// Every Request kept, in creation order; the live ones are the pending ones. Every Request lives for
    /// the same TTL, so the oldest pending Request is also the first to expire.
    ///
    /// Boxed: a table slot stays small, and the table is over-allocated by up to half as it grows.
    requests: Retained<Box<RequestEntry>>,
    /// What the pending Requests hold.
    shares: Shares,
    /// Every call kept; the live ones have not ended.
    ///
    /// Boxed, as the Requests are: a table slot stays small.
    calls: Retained<Box<CallEntry>>,
    /// How many calls each principal has running (or waiting on input), so that starting one does not walk
    /// every live call.
    running: Running,
    /// Every session kept; the live ones are open.
    sessions: Retained<SessionView>,
    /// URL-mode Requests by session and `elicitationId`, to match `notifications/elicitation/complete`
    /// without looking through every Request kept.
    completions: HashMap<(Option<SessionId>, String), RequestId>,
    events: VecDeque<Arc<Event>>,
    /// The audit chain's links of the events kept, oldest first: those of events forgotten go with them.
    chain: VecDeque<Link>,
    /// The bytes of the events' data.
    replay_bytes: usize,
    last_event: u64,
    /// What ended calls hold, in all and per principal.
    ended: Held,
    ended_by_principal: HashMap<String, EndedShare>,
    webhook_cursors: HashMap<String, u64>,
    keys: HashMap<String, String>,
    /// Standing grants, oldest first.
    grants: Vec<crate::records::GrantView>,
    /// How long ended records are kept.
    retention: Duration,
}

/// What one principal's ended calls hold, and their ids, oldest first.
#[derive(Debug, Default)]
struct EndedShare {
    held: Held,
    ids: VecDeque<CallId>,
}

#[derive(Debug)]
struct RequestEntry {
    view: RequestView,
    deadline: Timestamp,
    /// Boxed: a 2025-11-25 form has neither key, and its entry keeps no room for them.
    keys: Option<Box<Keys>>,
    bytes: usize,
    /// The tool of the call that raised it, which a listing picks by: kept here, as an ended call may be
    /// forgotten before its Requests.
    tool: Option<Box<str>>,
}

/// What a Request is matched by besides its id.
#[derive(Debug)]
struct Keys {
    /// The `elicitationId` of a URL-mode Request.
    elicitation_id: Option<String>,
    /// Its key in its call's round (2026-07-28).
    input_key: Option<String>,
}

impl RequestEntry {
    fn elicitation_id(&self) -> Option<&String> {
        self.keys.as_ref()?.elicitation_id.as_ref()
    }

    fn input_key(&self) -> Option<&String> {
        self.keys.as_ref()?.input_key.as_ref()
    }
}

#[derive(Debug)]
struct CallEntry {
    view: CallView,
    /// How many of its Requests are pending.
    pending: usize,
    shared: bool,
    /// Whether it was sent upstream once its approval was given.
    forwarded: bool,
    /// Its latest round (2026-07-28).
    round: Option<Box<Round>>,
}

/// A call's latest round: its number, the state to echo, the Requests that answer it, and what each input
/// request asked for.
#[derive(Debug, Default)]
struct Round {
    number: u32,
    request_state: Option<String>,
    requests: Vec<RequestId>,
    asked: Vec<(String, Asked)>,
}

/// The changes one verb makes: the events to record, in order.
#[derive(Default)]
struct Changes {
    events: Vec<Event>,
}

impl Memory {
    /// An empty store publishing to `feed`, its instants read from `clock`.
    pub fn new(feed: Feed, retention: Duration, clock: Clock) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    retention,
                    ..State::default()
                }),
                feed,
                clock,
            }),
        }
    }

    /// The clock this store stamps what it records by.
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    pub async fn events_after(&self, after: u64, limit: usize) -> Result<EventPage, StoreError> {
        let state = self.lock();
        let oldest = state.events.front().map_or(state.last_event + 1, |event| event.id);
        if after > state.last_event || after + 1 < oldest {
            let resume_after = if after > state.last_event {
                state.last_event
            } else {
                oldest - 1
            };
            return Ok(EventPage {
                events: Vec::new(),
                gap: true,
                resume_after,
            });
        }
        let skip = usize::try_from(after + 1 - oldest).unwrap_or(usize::MAX);
        Ok(EventPage {
            events: state.events.iter().skip(skip).take(limit).cloned().collect(),
            gap: false,
            resume_after: after,
        })
    }

    pub async fn last_event_id(&self) -> Result<u64, StoreError> {
        Ok(self.lock().last_event)
    }

    pub async fn webhook_cursor(&self, webhook: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.lock().webhook_cursors.get(webhook).copied())
    }

    pub fn save_webhook_cursor(&self, webhook: &str, event: u64) {
        let mut state = self.lock();
        let delivered = state.webhook_cursors.entry(webhook.to_owned()).or_insert(event);
        *delivered = (*delivered).max(event);
    }

    pub async fn kept_key(&self, name: &str, made: &str) -> Result<String, StoreError> {
        let mut state = self.lock();
        Ok(state
            .keys
            .entry(name.to_owned())
            .or_insert_with(|| made.to_owned())
            .clone())
    }

    /// The one gateway of a memory store always holds its webhooks.
    pub async fn hold_webhook(&self, webhook: &str, _holder: &str, _lease: Duration) -> Result<Lease, StoreError> {
        Ok(Lease::Mine(self.webhook_cursor(webhook).await?))
    }

    /// Nothing survives a previous run in memory.
    pub async fn recover(&self, _restarted: &str) -> Result<Recovered, StoreError> {
        Ok(Recovered::default())
    }

    /// Ended records are retired with their own deadline, and events are kept by number
    /// ([`REPLAY_CAPACITY`]): the horizons change nothing here.
    pub async fn prune(&self, _horizons: Horizons) -> Result<(), StoreError> {
        self.lock().purge(self.shared.clock.now());
        Ok(())
    }

    pub async fn size(&self) -> Option<u64> {
        None
    }

    /// Numbers the changes' events, keeps them for replay and publishes them, under the lock so that they
    /// reach subscribers in order.
    fn publish(&self, state: &mut State, changes: Changes) {
        let now = self.shared.clock.now();
        let events: Vec<Arc<Event>> = changes
            .events
            .into_iter()
            .map(|event| state.record(event, now))
            .collect();
        self.shared.feed.publish(events);
    }

    /// Like `publish`, with one event already built (to be returned numbered) before the changes.
    fn publish_with(&self, state: &mut State, event: Arc<Event>, changes: Changes) -> Arc<Event> {
        let now = self.shared.clock.now();
        let event = state.record(Arc::unwrap_or_clone(event), now);
        let mut events = vec![event.clone()];
        events.extend(changes.events.into_iter().map(|event| state.record(event, now)));
        self.shared.feed.publish(events);
        event
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.shared.state)
    }
}

impl State {
    /// Numbers an event recorded at `now` and keeps it for replay.
    fn record(&mut self, mut event: Event, now: Timestamp) -> Arc<Event> {
        self.last_event += 1;
        event.id = self.last_event;
        event.at = now;
        let event = Arc::new(event);
        self.replay_bytes += event.data.len();
        self.events.push_back(event.clone());
        while self.events.len() > REPLAY_CAPACITY || (self.replay_bytes > REPLAY_BYTES && self.events.len() > 1) {
            if let Some(gone) = self.events.pop_front() {
                self.replay_bytes -= gone.data.len();
            }
        }
        let oldest = self.events.front().map_or(event.id, |oldest| oldest.id);
        while self.chain.front().is_some_and(|link| link.id < oldest) {
            self.chain.pop_front();
        }
        event
    }

    /// Counts what an ended call holds, then forgets the oldest ended calls of its principal, and of all,
    /// past what they may hold.
    fn keep_ended(&mut self, view: &CallView) {
        let bytes = ended_bytes(view);
        let share = self.ended_by_principal.entry(view.owner.clone()).or_default();
        share.ids.push_back(view.id.clone());
        for held in [&mut self.ended, &mut share.held] {
            held.add(bytes);
        }
        loop {
            // The call that just ended stays, whatever it holds: its caller is about to read it.
            let oldest = match self.ended_by_principal.get(&view.owner) {
                Some(share) if share.held.exceeds(&ENDED_CALLS_PER_PRINCIPAL) => {
                    share.ids.front().filter(|oldest| **oldest != view.id).cloned()
                }
                _ => None,
            };
            let Some(oldest) = oldest else { break };
            match self.calls.forget(&oldest) {
                Some(entry) => self.release_ended(&entry.view),
                None => {
                    if let Some(share) = self.ended_by_principal.get_mut(&view.owner) {
                        share.ids.pop_front();
                    }
                }
            }
        }
        while self.ended.exceeds(&ENDED_CALLS) {
            let Some(oldest) = self
                .calls
                .oldest_retired()
                .filter(|oldest| **oldest != *view.id.as_str())
            else {
                break;
            };
            self.forget_ended(&oldest);
        }
    }

    /// Forgets an ended call before its retention ends.
    fn forget_ended(&mut self, id: &str) {
        if let Some(entry) = self.calls.forget(id) {
            self.release_ended(&entry.view);
        }
    }

    /// Stops counting what a forgotten ended call held.
    fn release_ended(&mut self, view: &CallView) {
        let bytes = ended_bytes(view);
        self.ended.release(bytes);
        if let Some(share) = self.ended_by_principal.get_mut(&view.owner) {
            share.held.release(bytes);
            // Ended calls go oldest first, so this one is at the front.
            match share.ids.front() {
                Some(front) if *front == view.id => {
                    share.ids.pop_front();
                }
                _ => share.ids.retain(|id| *id != view.id),
            }
            if share.held.count == 0 {
                self.ended_by_principal.remove(&view.owner);
            }
        }
    }

    /// Resolves one pending Request without an answer and records its event; returns its view and the call
    /// whose round it completed.
    fn resolve_one(
        &mut self,
        id: &RequestId,
        resolution: &Resolution,
        now: Timestamp,
        changes: &mut Changes,
    ) -> (RequestView, Option<Retry>) {
        let entry = self.requests.get_mut(id).expect("the caller found it pending");
        super::views::resolve_view(&mut entry.view, resolution, now);
        let view = entry.view.clone();
        changes.events.push(Event::request(EventKind::RequestResolved, &view));
        let resumes = self.retire_request(id, now, changes);
        (view, resumes)
    }

    /// What retrying a call takes, if it has not ended and its latest round is answered, or it follows a task.
    fn retry(&self, call: &CallId) -> Option<Retry> {
        let entry = self.calls.get(call).filter(|entry| !entry.view.status.is_final())?;
        let task = entry.view.task.as_ref().map(|task| task.id.clone());
        // A task is followed on without a round; a call that is no task is retried only to answer one.
        let none = Round::default();
        let Round {
            number: round,
            request_state,
            requests,
            asked,
        } = match entry.round.as_deref() {
            Some(round) => round,
            None if task.is_some() => &none,
            None => return None,
        };
        let mut input_responses = Map::new();
        for request in requests {
            let request = self.requests.get(request)?;
            if request.view.status == Status::Pending {
                return None;
            }
            let result = request.view.result.as_ref().map_or_else(
                || serde_json::json!({"action": "cancel"}),
                |result| serde_json::to_value(result).unwrap_or_default(),
            );
            input_responses.insert(request.input_key()?.clone(), result);
        }
        Some(Retry {
            call: call.to_owned(),
            owner: entry.view.owner.clone(),
            server: entry.view.server.clone(),
            session: entry.view.session.clone(),
            shared: entry.shared,
            tool: entry.view.tool.clone(),
            arguments: entry.view.arguments.clone(),
            round: *round,
            request_state: request_state.clone(),
            input_responses,
            asked: asked.clone(),
            task,
        })
    }

    /// Takes a Request that was just resolved off the pending ones, and updates its call: returns what
    /// retrying the call takes if its round is now complete.
    fn retire_request(&mut self, id: &RequestId, now: Timestamp, changes: &mut Changes) -> Option<Retry> {
        let retention = {
            let entry = self.requests.get(id)?;
            let server = entry.view.server.as_deref().unwrap_or_default();
            self.shares.remove(entry.view.owner.as_deref(), server, entry.bytes);
            entry.view.call.clone().map(|call| (call, entry.input_key().is_some()))
        };
        self.requests.retire(id, now.after(self.retention));
        let (call, in_round) = retention?;
        let entry = self.calls.get_mut(&call)?;
        entry.pending = entry.pending.saturating_sub(1);
        let complete = entry.pending == 0 && in_round && !entry.view.status.is_final();
        self.call_changed(&call, changes);
        complete.then(|| self.retry(&call)).flatten()
    }

    /// Publishes `call.updated` when a call that has not ended starts or stops waiting on Requests.
    fn call_changed(&mut self, call: &CallId, changes: &mut Changes) {
        let Some(entry) = self.calls.get_mut(call) else { return };
        if entry.view.status.is_final() {
            return;
        }
        let status = CallStatus::unended(entry.pending > 0);
        if entry.view.status != status {
            entry.view.status = status;
            changes.events.push(Event::call(&entry.view));
        }
    }

    /// Forgets ended records whose time has come.
    fn purge(&mut self, now: Timestamp) {
        let purged = self.requests.purge(now);
        for entry in purged {
            if let Some(elicitation_id) = entry.elicitation_id() {
                let key = (entry.view.session.clone(), elicitation_id.clone());
                if self.completions.get(&key) == Some(&entry.view.request.id) {
                    self.completions.remove(&key);
                }
            }
        }
        for entry in self.calls.purge(now) {
            self.release_ended(&entry.view);
        }
        self.sessions.purge(now);
        let kept_since = now.before(self.retention);
        let sessions = &self.sessions;
        self.grants.retain(|grant| {
            let ended = grant
                .revoked_at
                .or(grant.expires_at)
                .is_some_and(|end| end < kept_since);
            let session_gone = grant
                .session
                .as_ref()
                .is_some_and(|session| sessions.get(session).is_none());
            !ended && !session_gone
        });
    }
}

/// What an ended call holds in memory: its arguments and its result or error.
fn ended_bytes(view: &CallView) -> usize {
    view.arguments.text().len()
        + view.result.as_ref().map_or(0, json_size)
        + view.error.as_ref().map_or(0, |error| error.message.len())
}
