//! The Requests in memory: raising them with their round, deciding answers, resolving them otherwise, and
//! reading them.

use super::*;

impl Memory {
    pub async fn raise(
        &self,
        requests: Vec<NewRequest>,
        round: Option<NewRound>,
        caps: PendingCaps,
    ) -> Result<Vec<RequestView>, RaiseError> {
        let mut state = self.lock();
        if let Some(taken) = crate::store::chosen_ids(&requests).find(|id| state.requests.get(id).is_some()) {
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
            call.round = Some(Box::new(Round {
                number: round.number,
                request_state: round.request_state.clone(),
                requests: requests.iter().map(|new| new.request.id.clone()).collect(),
                asked: Asked::of_round(&round.input_requests),
            }));
        }
        let mut views = Vec::with_capacity(requests.len());
        let mut calls = Vec::new();
        for new in requests {
            let view = crate::store::views::raised_view(&new);
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
                .add(new.owner.as_deref(), crate::store::shares::server_key(&new), new.bytes);
            let tool = new.call.as_ref().and_then(|call| state.calls.get(call));
            let entry = RequestEntry {
                tool: tool.map(|call| call.view.tool.as_str().into()),
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
        let now = self.shared.clock.now();
        let decision = match decision::decide(&entry.view, &proposal, now) {
            Ok(decision::Decided::Resolves(decision)) => decision,
            Ok(decision::Decided::Counts(signoff)) => {
                entry.view.decisions.push(signoff);
                let view = entry.view.clone();
                let event = Arc::new(Event::request(EventKind::RequestUpdated, &view));
                let event = self.publish_with(&mut state, event, Changes::default());
                return Ok(Answered::Counted { view, event });
            }
            Err(undecided) => return Ok(Answered::undecided(undecided, entry.view.clone())),
        };
        let mut changes = Changes::default();
        if let Some(detail) = proposal.upstream.as_ref().and_then(Upstream::withdrawal) {
            let resolution = Resolution::Cancelled {
                detail,
                told_cancel: false,
            };
            let (view, _) = state.resolve_one(id, &resolution, now, &mut changes);
            self.publish(&mut state, changes);
            return Ok(Answered::Withdrawn(view));
        }
        crate::store::views::answer_view(&mut entry.view, decision, now);
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
            if filter.matches(&entry.view, entry.tool.as_deref()) {
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
}
