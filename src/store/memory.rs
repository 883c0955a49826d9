//! The store in process memory: every record under one lock, ended ones forgotten after the retention, and
//! the last events kept for streams that reconnect.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::model::Implementation;
use serde_json::Map;

use super::shares::{Held, Running, Shares};
use super::{
    Answered, EventPage, Finished, InsertCallError, InsertSessionError, Lease, NewCall, NewRequest, NewRound,
    NewSession, Pending, PendingCaps, RaiseError, Recovered, Resolution, Resolved, Retry, Started, StoreError,
};
use crate::decision::{self, Proposal, Upstream};
use crate::feed::Feed;
use crate::ids::{CallId, RequestId, SessionId};
use crate::records::json_size;
use crate::records::{
    CallError, CallFilter, CallStatus, CallView, Event, EventKind, Filter, Finish, RequestView, SessionFilter,
    SessionStatus, SessionView, Status,
};
use crate::retained::Retained;
use crate::time::{Clock, Timestamp};

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
    /// The bytes of the events' data.
    replay_bytes: usize,
    last_event: u64,
    /// What ended calls hold, in all and per principal.
    ended: Held,
    ended_by_principal: HashMap<String, EndedShare>,
    webhook_cursors: HashMap<String, u64>,
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
    /// Its latest round (2026-07-28): the number, the state to echo, and the Requests that answer it.
    round: Option<(u32, Option<String>, Vec<RequestId>)>,
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

    pub async fn raise(
        &self,
        requests: Vec<NewRequest>,
        round: Option<NewRound>,
        caps: PendingCaps,
    ) -> Result<Vec<RequestView>, RaiseError> {
        let mut state = self.lock();
        if let Some(taken) = super::chosen_ids(&requests).find(|id| state.requests.get(id).is_some()) {
            return Err(RaiseError::Taken(taken.to_owned()));
        }
        state.shares.admit(&requests, &caps)?;
        for call in requests.iter().filter_map(|new| new.call.as_ref()) {
            if state.calls.get(call).is_none_or(|entry| entry.view.status.is_final()) {
                return Err(RaiseError::CallEnded(call.clone()));
            }
        }
        let mut changes = Changes::default();
        if let Some(round) = &round
            && let Some(call) = state.calls.get_mut(&round.call)
        {
            let ids = requests.iter().map(|new| new.request.id.clone()).collect();
            call.round = Some((round.number, round.request_state.clone(), ids));
        }
        let mut views = Vec::with_capacity(requests.len());
        let mut calls = Vec::new();
        for new in requests {
            let view = super::views::raised_view(&new);
            changes.events.push(Event::request(EventKind::RequestCreated, &view));
            if let Some(elicitation_id) = &new.elicitation_id {
                let key = (new.session.clone(), elicitation_id.clone());
                state.completions.insert(key, new.request.id.clone());
            }
            if let Some(call) = new.call.as_ref()
                && let Some(entry) = state.calls.get_mut(call)
            {
                entry.view.requests.push(new.request.id.clone());
                entry.view.updated_at = new.created_at;
                entry.pending += 1;
                if !calls.iter().any(|id| id == call) {
                    calls.push(call.to_owned());
                }
            }
            state
                .shares
                .add(new.owner.as_deref(), super::shares::server_key(&new), new.bytes);
            let entry = RequestEntry {
                view: view.clone(),
                deadline: new.deadline,
                keys: (new.elicitation_id.is_some() || new.input_key.is_some()).then(|| {
                    Box::new(Keys {
                        elicitation_id: new.elicitation_id,
                        input_key: new.input_key,
                    })
                }),
                bytes: new.bytes,
            };
            state.requests.insert(&new.request.id, Box::new(entry));
            views.push(view);
        }
        for call in calls {
            state.call_changed(&call, &mut changes);
        }
        self.publish(&mut state, changes);
        Ok(views)
    }

    pub async fn answer(&self, id: &RequestId, proposal: Proposal) -> Result<Answered, StoreError> {
        let mut state = self.lock();
        let Some(entry) = state.requests.get_mut(id) else {
            return Ok(Answered::NotFound);
        };
        let decision = match decision::decide(&entry.view, &proposal) {
            Ok(decision) => decision,
            Err(undecided) => return Ok(Answered::undecided(undecided, entry.view.clone())),
        };
        let mut changes = Changes::default();
        let now = self.shared.clock.now();
        if let Some(detail) = proposal.upstream.as_ref().and_then(Upstream::withdrawal) {
            let resolution = Resolution::Cancelled {
                detail,
                told_cancel: false,
            };
            let (view, _) = state.resolve_one(id, &resolution, now, &mut changes);
            self.publish(&mut state, changes);
            return Ok(Answered::Withdrawn(view));
        }
        super::views::answer_view(&mut entry.view, decision, now);
        let view = entry.view.clone();
        let event = Arc::new(Event::request(EventKind::RequestResolved, &view));
        let resumes = state.retire_request(id, now, &mut changes);
        let event = self.publish_with(&mut state, event, changes);
        Ok(Answered::Won {
            view,
            event,
            resumes: resumes.map(Box::new),
        })
    }

    pub async fn resolve(&self, which: Pending, resolution: Resolution) -> Result<Resolved, StoreError> {
        let mut state = self.lock();
        let ids: Vec<RequestId> = match which {
            Pending::Ids(ids) => ids,
            Pending::Session(session) => state
                .requests
                .live()
                .filter(|entry| entry.view.session.as_ref() == Some(&session) && entry.input_key().is_none())
                .map(|entry| entry.view.request.id.clone())
                .collect(),
            Pending::Elicitations => state
                .requests
                .live()
                .filter(|entry| entry.input_key().is_none() && entry.view.session.is_some())
                .map(|entry| entry.view.request.id.clone())
                .collect(),
            Pending::All => state
                .requests
                .live()
                .map(|entry| entry.view.request.id.clone())
                .collect(),
        };
        let mut changes = Changes::default();
        let mut resolved = Resolved::default();
        let now = self.shared.clock.now();
        for id in ids {
            if state
                .requests
                .get(&id)
                .is_some_and(|entry| entry.view.status == Status::Pending)
            {
                let (view, resumes) = state.resolve_one(&id, &resolution, now, &mut changes);
                resolved.views.push(view);
                resolved.resumes.extend(resumes);
            }
        }
        self.publish(&mut state, changes);
        Ok(resolved)
    }

    pub async fn expire_due(&self, now: Timestamp, limit: usize) -> Result<Resolved, StoreError> {
        let mut state = self.lock();
        let due: Vec<RequestId> = state
            .requests
            .live()
            .take_while(|entry| entry.deadline <= now)
            .take(limit)
            .map(|entry| entry.view.request.id.clone())
            .collect();
        let mut changes = Changes::default();
        let mut resolved = Resolved::default();
        for id in due {
            let (view, resumes) = state.resolve_one(&id, &Resolution::Expired, self.shared.clock.now(), &mut changes);
            resolved.views.push(view);
            resolved.resumes.extend(resumes);
        }
        self.publish(&mut state, changes);
        Ok(resolved)
    }

    pub async fn next_deadline(&self) -> Result<Option<Timestamp>, StoreError> {
        Ok(self.lock().requests.live().next().map(|entry| entry.deadline))
    }

    pub async fn complete(&self, session: &SessionId, elicitation_id: &str) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let key = (Some(session.clone()), elicitation_id.to_owned());
        let Some(id) = state.completions.remove(&key) else {
            return Ok(false);
        };
        let Some(entry) = state
            .requests
            .get_mut(&id)
            .filter(|entry| entry.view.completed_at.is_none())
        else {
            return Ok(false);
        };
        entry.view.completed_at = Some(self.shared.clock.now());
        let event = Event::request(EventKind::RequestUpdated, &entry.view);
        self.publish(&mut state, Changes { events: vec![event] });
        Ok(true)
    }

    pub async fn undelivered(&self, id: &RequestId, detail: &str) -> Result<Option<RequestView>, StoreError> {
        let mut state = self.lock();
        let Some(entry) = state
            .requests
            .get_mut(id)
            .filter(|entry| entry.view.status == Status::Answered)
        else {
            return Ok(None);
        };
        entry.view.status = Status::Cancelled;
        entry.view.detail = Some(detail.to_owned());
        let view = entry.view.clone();
        let event = Event::request(EventKind::RequestUpdated, &view);
        self.publish(&mut state, Changes { events: vec![event] });
        Ok(Some(view))
    }

    pub async fn insert_call(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        let now = self.shared.clock.now();
        let view = CallView {
            id: CallId::mint(),
            server: call.server,
            session: call.session,
            tool: call.tool,
            arguments: call.arguments,
            owner: call.owner,
            via: call.via,
            status: CallStatus::Running,
            requests: Vec::new(),
            result: None,
            error: None,
            created_at: now,
            updated_at: now,
        };
        let mut state = self.lock();
        state.purge(now);
        let running = state.running.of(&view.owner);
        if running >= max_running {
            return Err(InsertCallError::TooMany(running));
        }
        let entry = CallEntry {
            view: view.clone(),
            pending: 0,
            shared: call.shared,
            forwarded: false,
            round: None,
        };
        state.calls.insert(&view.id, Box::new(entry));
        state.running.start(&view.owner);
        let event = Event::call(&view);
        self.publish(&mut state, Changes { events: vec![event] });
        Ok(Started {
            view,
            kept: Box::pin(std::future::ready(Ok(()))),
            deferred: false,
        })
    }

    pub async fn finish_call(&self, id: &CallId, finish: Finish) -> Result<Option<Finished>, StoreError> {
        let mut state = self.lock();
        let now = self.shared.clock.now();
        let Some(entry) = state.calls.get_mut(id).filter(|entry| !entry.view.status.is_final()) else {
            return Ok(None);
        };
        let detail = super::views::ended_call_detail(&finish);
        entry.view.status = finish.status();
        entry.view.updated_at = now;
        match finish {
            Finish::Completed(result) => entry.view.result = Some(Box::new(result)),
            Finish::Failed(error) => entry.view.error = Some(Box::new(error)),
            Finish::Cancelled(message) => entry.view.error = Some(Box::new(CallError::new(message))),
        }
        let requests = entry.view.requests.clone();
        let view = entry.view.clone();
        let until = now.after(state.retention);
        state.calls.retire(id, until);
        state.running.end(&view.owner);
        state.keep_ended(&view);
        let mut changes = Changes::default();
        let resolution = Resolution::Cancelled {
            detail,
            told_cancel: true,
        };
        let mut cancelled = Vec::new();
        for request in requests {
            if state
                .requests
                .get(&request)
                .is_some_and(|entry| entry.view.status == Status::Pending)
            {
                cancelled.push(state.resolve_one(&request, &resolution, now, &mut changes).0);
            }
        }
        changes.events.push(Event::call(&view));
        self.publish(&mut state, changes);
        Ok(Some(Finished { view, cancelled }))
    }

    pub async fn annotate_round(&self, call: &CallId, detail: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        let Some((_, _, requests)) = state.calls.get(call).and_then(|entry| entry.round.clone()) else {
            return Ok(());
        };
        let mut changes = Changes::default();
        for request in requests {
            if let Some(entry) = state.requests.get_mut(&request) {
                entry.view.detail = Some(detail.to_owned());
                changes
                    .events
                    .push(Event::request(EventKind::RequestUpdated, &entry.view));
            }
        }
        self.publish(&mut state, changes);
        Ok(())
    }

    pub async fn retry(&self, call: &CallId) -> Result<Option<Retry>, StoreError> {
        Ok(self.lock().retry(call))
    }

    pub async fn insert_session(
        &self,
        session: NewSession,
        max_open: usize,
    ) -> Result<SessionView, InsertSessionError> {
        let now = self.shared.clock.now();
        let view = SessionView {
            id: session.id,
            server: session.server,
            shared: session.owner.is_none(),
            owner: session.owner,
            status: SessionStatus::Starting,
            protocol_version: None,
            server_info: None,
            created_at: now,
            closed_at: None,
            detail: None,
            replica: Some(session.replica),
        };
        let mut state = self.lock();
        state.purge(now);
        let open = state.sessions.live().filter(|open| open.owner == view.owner).count();
        if open >= max_open {
            return Err(InsertSessionError::TooMany(open));
        }
        state.sessions.insert(&view.id, view.clone());
        let event = Event::session(&view);
        self.publish(&mut state, Changes { events: vec![event] });
        Ok(view)
    }

    pub async fn session_ready(
        &self,
        id: &SessionId,
        protocol_version: Option<String>,
        server_info: Option<Implementation>,
    ) -> Result<Option<SessionView>, StoreError> {
        let mut state = self.lock();
        let Some(view) = state.sessions.get_mut(id).filter(|view| !view.status.is_final()) else {
            return Ok(None);
        };
        view.status = SessionStatus::Ready;
        view.protocol_version = protocol_version;
        view.server_info = server_info;
        let view = view.clone();
        self.publish(
            &mut state,
            Changes {
                events: vec![Event::session(&view)],
            },
        );
        Ok(Some(view))
    }

    pub async fn end_session(
        &self,
        id: &SessionId,
        status: SessionStatus,
        detail: &str,
    ) -> Result<Option<SessionView>, StoreError> {
        let mut state = self.lock();
        let now = self.shared.clock.now();
        let Some(view) = state.sessions.get_mut(id).filter(|view| !view.status.is_final()) else {
            return Ok(None);
        };
        view.status = status;
        view.closed_at = Some(now);
        view.detail = Some(detail.to_owned());
        let view = view.clone();
        let until = now.after(state.retention);
        state.sessions.retire(id, until);
        self.publish(
            &mut state,
            Changes {
                events: vec![Event::session(&view)],
            },
        );
        Ok(Some(view))
    }

    pub async fn request(&self, id: &RequestId) -> Result<Option<RequestView>, StoreError> {
        Ok(self.lock().requests.get(id).map(|entry| entry.view.clone()))
    }

    pub async fn request_status(&self, id: &RequestId) -> Result<Option<(Status, Option<String>)>, StoreError> {
        Ok(self
            .lock()
            .requests
            .get(id)
            .map(|entry| (entry.view.status, entry.view.owner.clone())))
    }

    /// Listing pending Requests walks only those, however many resolved ones are kept.
    pub async fn requests(
        &self,
        filter: &Filter,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<RequestView>, Option<u64>), StoreError> {
        let state = self.lock();
        let candidates: Box<dyn Iterator<Item = (u64, &Box<RequestEntry>)>> = if filter.status == Some(Status::Pending)
        {
            Box::new(state.requests.live_range(cursor..))
        } else {
            Box::new(state.requests.range(cursor..))
        };
        let mut page = Vec::new();
        for (seq, entry) in candidates {
            if filter.matches(&entry.view) {
                if page.len() == limit {
                    return Ok((page, Some(seq)));
                }
                page.push(entry.view.clone());
            }
        }
        Ok((page, None))
    }

    pub async fn pending_count(&self) -> Result<usize, StoreError> {
        Ok(self.lock().requests.live_count())
    }

    pub async fn call(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        Ok(self.lock().calls.get(id).map(|entry| entry.view.clone()))
    }

    pub async fn forwarding(&self, id: &CallId) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let Some(entry) = state.calls.get_mut(id) else {
            return Ok(false);
        };
        let first = !entry.forwarded && entry.view.status == CallStatus::Running;
        entry.forwarded |= first;
        Ok(first)
    }

    pub async fn call_status(&self, id: &CallId) -> Result<Option<(CallStatus, String)>, StoreError> {
        Ok(self
            .lock()
            .calls
            .get(id)
            .map(|entry| (entry.view.status, entry.view.owner.clone())))
    }

    pub async fn calls(&self, filter: &CallFilter, limit: usize) -> Result<Vec<CallView>, StoreError> {
        Ok(self
            .lock()
            .calls
            .values()
            .filter(|entry| filter.matches(&entry.view))
            .take(limit)
            .map(|entry| entry.view.clone())
            .collect())
    }

    pub async fn running_calls(&self, session: Option<&SessionId>) -> Result<Vec<CallView>, StoreError> {
        Ok(self
            .lock()
            .calls
            .live()
            .filter(|entry| session.is_none_or(|session| entry.view.session == *session))
            .map(|entry| entry.view.clone())
            .collect())
    }

    pub async fn count_calls(&self) -> Result<Vec<(CallStatus, usize)>, StoreError> {
        let mut counts = std::collections::BTreeMap::new();
        for entry in self.lock().calls.values() {
            *counts.entry(entry.view.status).or_default() += 1;
        }
        Ok(counts.into_iter().collect())
    }

    pub async fn session(&self, id: &SessionId) -> Result<Option<SessionView>, StoreError> {
        Ok(self.lock().sessions.get(id).cloned())
    }

    pub async fn sessions(&self, filter: SessionFilter) -> Result<Vec<SessionView>, StoreError> {
        let state = self.lock();
        Ok(match filter {
            SessionFilter::All => state.sessions.values().cloned().collect(),
            SessionFilter::Open => state.sessions.live().cloned().collect(),
        })
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

    /// The one gateway of a memory store always holds its webhooks.
    pub async fn hold_webhook(&self, webhook: &str, _holder: &str, _lease: Duration) -> Result<Lease, StoreError> {
        Ok(Lease::Mine(self.webhook_cursor(webhook).await?))
    }

    /// Nothing survives a previous run in memory.
    pub async fn recover(&self, _restarted: &str) -> Result<Recovered, StoreError> {
        Ok(Recovered::default())
    }

    pub async fn prune(&self, before: Timestamp) -> Result<(), StoreError> {
        // Ended records are retired with their own deadline; `before` is when the oldest may still be kept.
        let _ = before;
        self.lock().purge(self.shared.clock.now());
        Ok(())
    }

    pub async fn size(&self) -> Option<u64> {
        None
    }

    /// Numbers the changes' events, keeps them for replay and publishes them, under the lock so that they
    /// reach subscribers in order.
    fn publish(&self, state: &mut State, changes: Changes) {
        let events: Vec<Arc<Event>> = changes.events.into_iter().map(|event| state.record(event)).collect();
        self.shared.feed.publish(events);
    }

    /// Like `publish`, with one event already built (to be returned numbered) before the changes.
    fn publish_with(&self, state: &mut State, event: Arc<Event>, changes: Changes) -> Arc<Event> {
        let event = state.record(Arc::unwrap_or_clone(event));
        let mut events = vec![event.clone()];
        events.extend(changes.events.into_iter().map(|event| state.record(event)));
        self.shared.feed.publish(events);
        event
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Numbers an event and keeps it for replay.
    fn record(&mut self, mut event: Event) -> Arc<Event> {
        self.last_event += 1;
        event.id = self.last_event;
        let event = Arc::new(event);
        self.replay_bytes += event.data.len();
        self.events.push_back(event.clone());
        while self.events.len() > REPLAY_CAPACITY || (self.replay_bytes > REPLAY_BYTES && self.events.len() > 1) {
            if let Some(gone) = self.events.pop_front() {
                self.replay_bytes -= gone.data.len();
            }
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

    /// What retrying a call takes, if its latest round is answered and it has not ended.
    fn retry(&self, call: &CallId) -> Option<Retry> {
        let entry = self.calls.get(call).filter(|entry| !entry.view.status.is_final())?;
        let (round, request_state, requests) = entry.round.as_ref()?;
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
    }
}

/// What an ended call holds in memory: its arguments and its result or error.
fn ended_bytes(view: &CallView) -> usize {
    view.arguments.text().len()
        + view.result.as_ref().map_or(0, json_size)
        + view.error.as_ref().map_or(0, |error| error.message.len())
}
