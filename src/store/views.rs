//! How a call's view begins and a Request's changes as it is raised and resolved, the same in every engine.

use rmcp::model::{ElicitResult, ElicitationAction};

use super::{NewCall, NewRequest, Resolution};
use crate::decision::Decision;
use crate::ids::CallId;
use crate::records::{CallError, CallStatus, CallView, Finish, RequestView, Status};
use crate::suspension::Answer;
use crate::time::Timestamp;

/// The view of call `id` just started.
pub(crate) fn started_view(id: CallId, call: &NewCall, now: Timestamp) -> CallView {
    CallView {
        id,
        server: call.server.clone(),
        session: call.session.clone(),
        tool: call.tool.clone(),
        arguments: call.arguments.clone(),
        owner: call.owner.clone(),
        via: call.via,
        status: CallStatus::Running,
        requests: Vec::new(),
        result: None,
        error: None,
        task: None,
        allowed: None,
        created_at: now,
        updated_at: now,
    }
}

/// The view of a Request just raised.
pub(crate) fn raised_view(new: &NewRequest) -> RequestView {
    RequestView {
        request: new.request.clone(),
        status: Status::Pending,
        server: new.server.clone(),
        session: new.session.clone(),
        call: new.call.clone(),
        owner: new.owner.clone(),
        created_at: new.created_at,
        resolved_at: None,
        answer: None,
        answered_by: None,
        answerer: None,
        result: None,
        detail: None,
        completed_at: None,
        decisions: Vec::new(),
    }
}

/// Applies a resolution to a pending Request's view.
pub(crate) fn resolve_view(view: &mut RequestView, resolution: &Resolution, now: Timestamp) {
    view.resolved_at = Some(now);
    match resolution {
        Resolution::Expired => {
            view.status = Status::Expired;
            view.answer = Some(Box::new(Answer::expired(view.request.id.as_str())));
            if !view.is_posted() {
                view.result = Some(Box::new(ElicitResult::new(ElicitationAction::Cancel)));
            }
        }
        Resolution::Cancelled { detail, told_cancel } => {
            view.status = Status::Cancelled;
            view.detail = Some(detail.clone());
            if *told_cancel && !view.is_posted() {
                view.result = Some(Box::new(ElicitResult::new(ElicitationAction::Cancel)));
            }
        }
    }
}

/// Applies a winning answer to a pending Request's view.
pub(crate) fn answer_view(view: &mut RequestView, decision: Decision, now: Timestamp) {
    view.status = Status::Answered;
    view.resolved_at = Some(now);
    view.answer = Some(Box::new(decision.answer));
    view.answered_by = Some(decision.by.name.clone());
    view.answerer = Some(Box::new(decision.by));
    view.result = decision.result.map(Box::new);
    view.decisions.extend(decision.signoff);
}

/// Ends the view of a call that has not ended, as `finish` says, at `now`.
pub(crate) fn end_view(view: &mut CallView, finish: Finish, now: Timestamp) {
    view.status = finish.status();
    view.updated_at = now;
    match finish {
        Finish::Completed(result) => view.result = Some(Box::new(result)),
        Finish::Failed(error) => view.error = Some(Box::new(error)),
        Finish::Cancelled(message) => view.error = Some(Box::new(CallError::new(message))),
    }
}

/// The detail of the Requests of a call that ended while they were pending.
pub(crate) fn ended_call_detail(finish: &Finish) -> String {
    match finish {
        Finish::Completed(_) => "the call completed before the Request was answered".to_owned(),
        Finish::Failed(error) => error.message.clone(),
        Finish::Cancelled(message) => message.clone(),
    }
}
