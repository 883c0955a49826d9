//! Relay mode (`front_door.elicitation = "relay"`): what a call's upstream asks is also put to the MCP client,
//! when it declared elicitation in that mode.

use std::collections::HashSet;
use std::time::Duration;

use rmcp::model::{ClientResult, ServerRequest};
use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitResult, ErrorData, InputRequest, InputRequests, InputRequiredResult,
    InputResponses, ProtocolVersion,
};
use rmcp::service::{PeerRequestOptions, RequestContext};
use rmcp::{Peer, RoleServer};
use serde_json::json;

use super::{FrontDoor, lock};
use crate::api::to_completion;
use crate::auth::Principal;
use crate::elicitation::{elicit_result_to_answer, request_to_elicitation};
use crate::feed::{Concern, Key};
use crate::ids::{CallId, RequestId};
use crate::records::{CallView, Event, EventKind, Status};
use crate::registry::{AnswerError, may_answer};
use crate::suspension::RequestKind;

/// The longest a relayed question is followed for a resolution elsewhere: as long as a Request may live.
const RELAY_MOST: Duration = Duration::from_secs(365 * 24 * 3600);

impl FrontDoor {
    /// How the client is asked what the call's upstream asks, if it is: only with `front_door.elicitation =
    /// "relay"` and elicitation among the client's capabilities (form mode when it names no mode).
    pub(super) fn relay_to(&self, context: &RequestContext<RoleServer>) -> Option<Relay> {
        if !self.policy.relay {
            return None;
        }
        let elicitation = context.client_capabilities()?.elicitation?;
        let url = elicitation.url.is_some();
        Some(Relay {
            form: elicitation.form.is_some() || !url,
            url,
            returned: returned_era(context),
        })
    }

    /// The call's pending Requests that the client may answer and can show, not relayed before, with the
    /// elicitation params that ask each.
    pub(super) async fn relayable(
        &self,
        view: &CallView,
        principal: &Principal,
        relay: &Relay,
        handled: &HashSet<RequestId>,
    ) -> Vec<(RequestId, ElicitRequestParams)> {
        let mut asks = Vec::new();
        for id in view.requests.iter().filter(|id| !handled.contains(*id)) {
            let Ok(Some(request)) = self.state.registry.get(id).await else {
                continue;
            };
            // An approval is never put to the client: whoever calls a tool is the party it holds back.
            let shown = match request.request.kind {
                RequestKind::Input => relay.form,
                RequestKind::Authorization => relay.url,
                _ => false,
            };
            if request.status != Status::Pending || !shown || may_answer(&request, principal).is_err() {
                continue;
            }
            let params =
                request_to_elicitation(&request.request).and_then(|params| serde_json::from_value(params).ok());
            if let Some(params) = params {
                asks.push((id.clone(), params));
            }
        }
        asks
    }

    /// Sends a Request of `call` to a 2025-11-25 client as `elicitation/create`, and answers the Request with
    /// what it returns (validated as any answer is). The exchange outlives the hold that started it; a Request
    /// being asked is not asked again. When the Request is resolved elsewhere first (in the inbox, over REST, by
    /// its expiry), the client is told that its question is withdrawn (`notifications/cancelled`).
    pub(super) fn ask(
        &self,
        peer: Peer<RoleServer>,
        call: &CallId,
        request: RequestId,
        params: ElicitRequestParams,
        by: Principal,
    ) {
        if !lock(&self.asking).insert(request.clone()) {
            return;
        }
        let asking = self.asking.clone();
        let (registry, feed, shutdown) = (
            self.state.registry.clone(),
            self.state.feed.clone(),
            self.state.shutdown.clone(),
        );
        let call = call.to_owned();
        tokio::spawn(async move {
            let question = ServerRequest::ElicitRequest(ElicitRequest::new(params));
            let mut asked = match peer
                .send_cancellable_request(question, PeerRequestOptions::no_options())
                .await
            {
                Ok(asked) => asked,
                Err(error) => {
                    tracing::warn!(%request, %error, "relaying a Request to its MCP client failed");
                    lock(&asking).remove(&request);
                    return;
                }
            };
            let concerns = |event: &Event| {
                event.kind == EventKind::RequestResolved && event.call.as_deref() == Some(call.as_str())
            };
            let resolved = || async {
                let status = registry.status(&request).await;
                (!matches!(status, Ok(Some((Status::Pending, _))))).then_some(())
            };
            let key = Key::Call(call.to_string());
            let resolved_elsewhere = feed.wait_for(RELAY_MOST, &shutdown, Concern::EventsOf(key, &concerns), resolved);
            tokio::select! {
                replied = &mut asked.rx => match replied {
                    Ok(Ok(ClientResult::ElicitResult(result))) => {
                        let answer = elicit_result_to_answer(request.as_str(), &result);
                        if let Err(error) = registry.answer(&request, &by, answer).await {
                            tracing::warn!(%request, %error, "an MCP client's answer to a relayed Request was not taken");
                        }
                    }
                    Ok(Ok(_)) => tracing::warn!(%request, "an MCP client answered a relayed Request with something else"),
                    Ok(Err(error)) => tracing::warn!(%request, %error, "relaying a Request to its MCP client failed"),
                    Err(_) => tracing::debug!(%request, "the MCP client's session ended before it answered"),
                },
                Some(()) = resolved_elsewhere => {
                    let reason = "the Request was resolved in the gateway before the client answered".to_owned();
                    if let Err(error) = asked.cancel(Some(reason)).await {
                        tracing::debug!(%request, %error, "a relayed Request could not be withdrawn from its MCP client");
                    }
                }
            }
            lock(&asking).remove(&request);
        });
    }

    /// Answers the Requests a 2026-07-28 client was relayed, from the `inputResponses` of its retry; `call` is
    /// the `requestState` the gateway gave it.
    pub(super) async fn answer_relayed(
        &self,
        call: &CallId,
        responses: InputResponses,
        principal: &Principal,
    ) -> Result<(), ErrorData> {
        let unknown = || unknown_state(call.as_str());
        match self.state.calls.status(call).await {
            Ok(Some((_, owner))) if principal.may_change(Some(&owner)) => {}
            Ok(_) => return Err(unknown()),
            Err(error) => return Err(ErrorData::internal_error(error.to_string(), None)),
        }
        // Every response is checked before any is taken, so that a refused one leaves the others pending too.
        let mut answers = Vec::with_capacity(responses.len());
        for (key, response) in responses {
            let request = match RequestId::parse(&key) {
                Some(request)
                    if matches!(self.state.registry.get(&request).await,
                        Ok(Some(view)) if view.call.as_ref() == Some(call)) =>
                {
                    request
                }
                _ => {
                    return Err(ErrorData::invalid_params(
                        format!("inputResponses: {key:?} is not a Request of call {call}"),
                        None,
                    ));
                }
            };
            let result: ElicitResult = serde_json::from_value(response).map_err(|error| {
                ErrorData::invalid_params(format!("inputResponses.{request}: not an ElicitResult: {error}"), None)
            })?;
            self.state
                .registry
                .check_answerer(&request, principal)
                .await
                .map_err(|error| answer_error(&request, error))?;
            let answer = elicit_result_to_answer(request.as_str(), &result);
            answers.push((request, answer));
        }
        for (request, answer) in answers {
            let (registry, by) = (self.state.registry.clone(), principal.clone());
            let id = request.clone();
            let answered = to_completion(async move { Ok(registry.answer(&id, &by, answer).await) })
                .await
                .map_err(|error| ErrorData::internal_error(error.detail().to_owned(), None))?;
            match answered {
                // Answered or ended meanwhile, in the inbox or by the upstream: the call goes on as it is.
                Ok(_) | Err(AnswerError::Conflict(_) | AnswerError::Gone { .. }) => {}
                Err(error) => return Err(answer_error(&request, error)),
            }
        }
        Ok(())
    }
}

/// The error a client is given for its answer to `request` that was not taken.
fn answer_error(request: &RequestId, error: AnswerError) -> ErrorData {
    match error {
        AnswerError::Invalid(violations) => ErrorData::invalid_params(
            format!("inputResponses.{request}: {}", crate::registry::invalid(&violations)),
            Some(json!({"errors": violations})),
        ),
        AnswerError::Store(error) => ErrorData::internal_error(error.to_string(), None),
        error => ErrorData::invalid_params(format!("inputResponses.{request}: {error}"), None),
    }
}

/// Whether the client speaks 2026-07-28, where the server asks by returning `input_required` and has no
/// logging.
pub(super) fn returned_era(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
}

/// How a client is asked what a call's upstream asks.
#[derive(Debug)]
pub(super) struct Relay {
    /// It shows form-mode elicitations.
    form: bool,
    /// It shows URL-mode elicitations.
    url: bool,
    /// It speaks 2026-07-28: it gets them as an `input_required` result, not as requests.
    pub(super) returned: bool,
}

/// The call a 2026-07-28 client's `requestState` names: the gateway gives a call's id as its state.
pub(super) fn relayed_call(state: &str) -> Result<CallId, ErrorData> {
    CallId::parse(state).ok_or_else(|| unknown_state(state))
}

fn unknown_state(state: &str) -> ErrorData {
    ErrorData::invalid_params(format!("requestState {state:?} names no call of yours"), None)
}

/// The `input_required` result that relays Requests to a 2026-07-28 client; its `requestState` is the call's
/// id, which the client's retry sends back with the answers.
pub(super) fn input_required(call: &CallId, asks: Vec<(RequestId, ElicitRequestParams)>) -> InputRequiredResult {
    InputRequiredResult::new(Some(input_requests(asks)), Some(call.to_string()))
}

/// Requests relayed to a client, keyed by their ids.
pub(super) fn input_requests(asks: Vec<(RequestId, ElicitRequestParams)>) -> InputRequests {
    asks.into_iter()
        .map(|(id, params)| (id.into(), InputRequest::Elicitation(ElicitRequest::new(params))))
        .collect()
}
