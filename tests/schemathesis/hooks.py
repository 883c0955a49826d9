"""Schemathesis hooks for scripts/schemathesis.sh: what the gateway does by design that a check cannot know."""

import itertools
import re

import schemathesis

# `wait` holds a long-poll for up to 300 s while nothing changes; generated waits are capped so a run ends.
MAX_WAIT = 1.0
# The statuses a closed session or a cancelled or finished call keeps while it stays readable.
FINAL = {"closed", "failed", "cancelled", "completed"}


def _seconds(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


@schemathesis.hook
def map_query(context, query):
    """Caps a positive `wait` at MAX_WAIT; negative and malformed values are left for the gateway to reject."""
    if query and "wait" in query:
        seconds = _seconds(query["wait"])
        if seconds is not None and seconds > MAX_WAIT:
            query["wait"] = MAX_WAIT
    return query


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Keeps every failure but a read after DELETE that shows the resource closed or cancelled.

    `DELETE /sessions/{id}` closes a session and `DELETE /calls/{id}` cancels a call; both stay readable with
    that final status for `requests.retention`, as the README documents.
    """
    if failure.code != "ST301":
        return True
    try:
        status = response.json().get("status")
    except Exception:
        return True
    return status not in FINAL


# The ids a posted Request may take: `PostRequest.id` in the document.
POSTED_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_posted = itertools.count()


@schemathesis.hook
def map_body(context, body):
    """Makes each id a body of `POST /requests` chooses one no earlier body chose.

    The generator draws ids from a few short strings, so after the first each is taken (409, which
    tests/api covers), and the body's other keys would never be checked. A suffix keeps the id within the
    document's pattern; an id outside it is left for the gateway to reject.
    """
    operation = context.operation
    if operation is None or operation.method.upper() != "POST" or operation.path != "/requests":
        return body
    if isinstance(body, dict) and isinstance(body.get("id"), str) and POSTED_ID.fullmatch(body["id"]):
        suffix = f".{next(_posted)}"
        body["id"] = body["id"][: 128 - len(suffix)] + suffix
    return body
