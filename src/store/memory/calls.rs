//! Calls, their rounds, and Sessions in memory.

use super::*;

impl Memory {
    pub async fn insert_call(&self, call: NewCall, max_running: usize) -> Result<Started, InsertCallError> {
        let now = self.shared.clock.now();
        let view = crate::store::views::started_view(CallId::mint(), &call, now);
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
        })
    }

    pub async fn finish_call(&self, id: &CallId, finish: Finish) -> Result<Option<Finished>, StoreError> {
        let mut state = self.lock();
        let now = self.shared.clock.now();
        let Some(entry) = state.calls.get_mut(id).filter(|entry| !entry.view.status.is_final()) else {
            return Ok(None);
        };
        let detail = crate::store::views::ended_call_detail(&finish);
        crate::store::views::end_view(&mut entry.view, finish, now);
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
        let Some(requests) = state
            .calls
            .get(call)
            .and_then(|entry| entry.round.as_ref().map(|round| round.requests.clone()))
        else {
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

    pub async fn note_task(&self, call: &CallId, task: &CallTask) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let now = self.shared.clock.now();
        let Some(entry) = state.calls.get_mut(call).filter(|entry| !entry.view.status.is_final()) else {
            return Ok(false);
        };
        entry.view.task = Some(Box::new(task.clone()));
        entry.view.updated_at = now;
        let mut changes = Changes::default();
        changes.events.push(Event::call(&entry.view));
        self.publish(&mut state, changes);
        Ok(true)
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

    pub async fn call(&self, id: &CallId) -> Result<Option<CallView>, StoreError> {
        Ok(self.lock().calls.get(id).map(|entry| entry.view.clone()))
    }

    pub async fn forwarding(&self, id: &CallId, allowed: &Allowed, arguments: &Arguments) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let Some(entry) = state.calls.get_mut(id) else {
            return Ok(false);
        };
        if entry.forwarded || entry.view.status != CallStatus::Running {
            return Ok(false);
        }
        entry.forwarded = true;
        entry.view.allowed = Some(Box::new(allowed.clone()));
        entry.view.arguments = arguments.clone();
        entry.view.updated_at = self.shared.clock.now();
        let events = vec![Event::call(&entry.view)];
        self.publish(&mut state, Changes { events });
        Ok(true)
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
}
