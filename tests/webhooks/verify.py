"""A webhook receiver's checks, made by the Standard Webhooks library (standardwebhooks, from PyPI).

Reads {"secret": "whsec_…", "deliveries": [{"headers": {…}, "body": "<base64>", "later": seconds}]} on stdin
and writes one verdict per delivery, in order, as a JSON list on stdout: "accepted", or "refused: " and why.
Each delivery is verified as if it arrived `later` seconds from now (the library reads the time itself). Like
the receivers the spec describes, this one keeps the `webhook-id` of every delivery it accepted and refuses
one it has seen already.
"""

import base64
import datetime as real
import json
import sys

from standardwebhooks import webhooks
from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def at(later):
    """The library's datetime, its now() moved `later` seconds on."""

    class Later(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.datetime.now(tz) + real.timedelta(seconds=later)

    return Later


def main():
    given = json.load(sys.stdin)
    receiver = Webhook(given["secret"])
    seen = set()
    verdicts = []
    for delivery in given["deliveries"]:
        webhooks.datetime = at(delivery.get("later", 0))
        try:
            receiver.verify(base64.b64decode(delivery["body"]), delivery["headers"])
        except WebhookVerificationError as error:
            verdicts.append(f"refused: {error}")
            continue
        id = delivery["headers"]["webhook-id"]
        if id in seen:
            verdicts.append("refused: webhook-id already seen")
            continue
        seen.add(id)
        verdicts.append("accepted")
    json.dump(verdicts, sys.stdout)


main()
