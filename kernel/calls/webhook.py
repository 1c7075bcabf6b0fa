"""The approvals webhook: a signed notice to the deployment's receiver of each new tool call
held for a person (``CONFIRM``; docs/approvals.md), so an application learns that a call
waits without polling ``GET /v1/tool-calls?state=pending``. Off unless the settings name a
receiver (``approvals_webhook_url``).

Why it is built this way:

- The receiver is the deployment's (the operator's), one for every tenant, and must lie inside
  the deployment's egress allow-list (``judge_egress``, ``fak.egress``): checked when the
  settings load and again when the kernel opens. No redirect is followed, so an answer cannot
  send a notice anywhere else.
- A notice names the call and where to decide it (call id, tenant, session, tool, verdict,
  rule, the decision's audit index, who produced it, links), never the call's arguments nor
  the findings: they may carry what the model read from untrusted content, or a secret the
  tenant's conversation holds. An approver reads them through the authenticated route.
- Delivery never blocks nor fails the request that held the call: ``notify`` only queues, and
  one thread posts, with a timeout per try, a bounded number of tries and exponential backoff;
  a full queue drops the notice. Each notice's fate is reported to ``outcome`` (the kernel
  counts it: ``fak_approval_webhooks_total``).
- Signed as Standard Webhooks sign (``webhook-id``, ``webhook-timestamp``, ``webhook-signature:
  v1,<base64 HMAC-SHA256 of id.timestamp.body>``, the ``standardwebhooks`` package). The id is
  the held call's, the same on every try, so a receiver drops a retry it already took.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import httpx
from standardwebhooks import Webhook

from fak.settings import SettingsError

if TYPE_CHECKING:
    from fak.kernel.calls.held import HeldCall
    from fak.settings import Settings

log = logging.getLogger("fak.approvals")

EVENT_TYPE = "tool_call.held"
Outcome = Literal["delivered", "refused", "failed", "dropped"]
RETRY_STATUSES = frozenset({408, 429})  # 4xx answers worth another try; any other 4xx refuses the notice
QUEUE = 1000


@dataclass(frozen=True)
class WebhookConfig:
    """Where and how notices go: the receiver, the signing secret, the links' base, the limits."""

    url: str
    secret: str  # Standard Webhooks' form: whsec_ and base64
    link_base: str = ""  # the server's address as people reach it; "" gives paths
    timeout_s: float = 5.0
    attempts: int = 5
    backoff_s: float = 0.5  # the wait before the first retry; doubled before each next one
    ttl_s: float = 24 * 3600.0  # approval_ttl_s: when a held call expires, which the notice says

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookConfig | None:
        """The webhook the settings name, None when none. ``SettingsError`` naming the setting
        for a receiver outside the egress allow-list (a ``Settings`` built without validation can
        still hold one) or a signing secret that is unset or malformed."""
        url = settings.approvals_webhook_url
        if url is None:
            return None
        if not settings.judge_allow_lists().allows_url(url):
            raise SettingsError(f"setting approvals_webhook_url: {url!r:.120} is outside judge_egress, the "
                                "deployment's egress allow-list")
        return cls(url=url, secret=settings.approvals_webhook_secret(), link_base=settings.approvals_link_base or "",
                   timeout_s=settings.approvals_webhook_timeout_s, attempts=settings.approvals_webhook_attempts,
                   ttl_s=settings.approval_ttl_s)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def links(call_id: str, base: str = "") -> dict[str, str]:
    """Where a person (console) or an application (REST) reads and decides a held call."""
    cid = quote(call_id, safe="")
    return {"call": f"{base}/v1/tool-calls/{cid}", "approve": f"{base}/v1/tool-calls/{cid}/approve",
            "reject": f"{base}/v1/tool-calls/{cid}/reject", "console": f"{base}/console/tool-calls/held/{cid}"}


def notice(call: HeldCall, *, link_base: str = "", ttl_s: float = 24 * 3600.0) -> dict[str, Any]:
    """The body of a held call's notice (Standard Webhooks' ``type``, ``timestamp``, ``data``):
    what waits and where to decide it, without the arguments or the findings."""
    return {"type": EVENT_TYPE, "timestamp": _iso(call.created), "data": {
        "id": call.call_id, "tenant": call.tenant, "session_id": call.session_id, "tool": call.tool,
        "verdict": "CONFIRM", "rule_id": call.rule_id, "decision_audit_index": call.decision_index,
        "produced_by": call.producer, "created": _iso(call.created), "expires": _iso(call.created + ttl_s),
        "links": links(call.call_id, link_base)}}


class HeldCallWebhook:
    """Posts a signed notice of each new held call to the deployment's receiver, from a thread
    of its own (``notify`` only queues). ``outcome(tenant, outcome)`` hears each notice's fate."""

    def __init__(self, config: WebhookConfig, outcome: Callable[[str, Outcome], None] | None = None, *,
                 queue_size: int = QUEUE) -> None:
        self.config = config
        self._signer = Webhook(config.secret)
        self._outcome = outcome
        self._queue: queue.Queue[tuple[str, str, bytes] | None] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(config.timeout_s), follow_redirects=False,
                                    headers={"content-type": "application/json", "user-agent": "fak-approvals"})
        self._thread = threading.Thread(target=self._run, name="fak-approvals-webhook", daemon=True)
        self._thread.start()

    def notify(self, call: HeldCall) -> None:
        """Queue the notice of a call just held; never blocks, never raises (a full queue drops it)."""
        body = json.dumps(notice(call, link_base=self.config.link_base, ttl_s=self.config.ttl_s),
                          ensure_ascii=False, separators=(",", ":")).encode()
        try:
            self._queue.put_nowait((call.tenant, call.call_id, body))
        except queue.Full:
            log.warning("approvals webhook: queue full, notice of held call %s dropped", call.call_id)
            self._report(call.tenant, "dropped")

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop: the try in flight may end within ``timeout_s`` (else it ends by its own timeout,
        and the thread closes the client then); notices still queued are not sent (the queue of
        pending calls, ``GET /v1/tool-calls``, still lists them)."""
        self._stop.set()
        with contextlib.suppress(queue.Full):  # full: the thread sees the stop after its current notice
            self._queue.put_nowait(None)
        self._thread.join(timeout_s)
        left = self._queue.qsize()
        if left:
            log.warning("approvals webhook closed with %d notice(s) not sent", left)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._queue.get()
                if item is None:
                    return
                tenant, call_id, body = item
                self._report(tenant, self.deliver(call_id, body))
        finally:  # the thread owns the client: closed once no try can use it any more
            self._client.close()

    def deliver(self, msg_id: str, body: bytes) -> Outcome:
        """Post one notice, trying again after a failure (a network error, a timeout, a 3xx, a
        5xx, 408 or 429) up to ``attempts`` times; each try is signed anew (its own timestamp)."""
        wait = self.config.backoff_s
        for attempt in range(1, self.config.attempts + 1):
            if attempt > 1 and self._stop.wait(wait):
                return "failed"
            if attempt > 1:
                wait *= 2
            now = datetime.now(UTC)
            headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())),
                       "webhook-signature": self._signer.sign(msg_id, now, body)}
            try:
                status = self._client.post(self.config.url, content=body, headers=headers).status_code
            except httpx.HTTPError as exc:
                log.warning("approvals webhook: try %d for %s failed: %s", attempt, msg_id, type(exc).__name__)
                continue
            if 200 <= status < 300:
                return "delivered"
            log.warning("approvals webhook: try %d for %s answered %d", attempt, msg_id, status)
            if 400 <= status < 500 and status not in RETRY_STATUSES:
                return "refused"
        return "failed"

    def _report(self, tenant: str, outcome: Outcome) -> None:
        if self._outcome is None:
            return
        try:
            self._outcome(tenant, outcome)
        except Exception:  # a counter that fails never stops the deliveries
            log.exception("approvals webhook: the outcome hook failed")
