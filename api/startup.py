"""What ``fak serve`` says when it starts: where it listens, what it loaded and what is still
missing, so that the first minutes need no guessing (which model, which policy and its digest,
which data directory and database, whether any API key exists yet, who the operator is).

Secrets never appear: a database URL's password is masked, keys are counted, not shown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from fak.api.keys import KeyStore
    from fak.kernel.facade import Kernel

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
NO_OPERATOR = "unset (operator_tenant): nobody may replace the policy over the API, pin MCP tools or scrape every tenant"


def summary(kernel: Kernel, keys: KeyStore, host: str, port: int) -> list[str]:
    """The lines ``fak serve`` prints before it accepts requests."""
    s = kernel.settings
    reach = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    base = f"http://{reach}:{port}"
    active = sum(1 for row in keys.list() if keys.state(row) == "active")
    policy = kernel.policy
    lines = [
        f"fak serve on {base} (bind {host}): OpenAI base_url {base}/v1, console {base}/console, "
        f"health {base}/healthz",
        f"  model     {kernel.model.cfg.name}, {kernel.model_id} ({kernel.model.weight_format} weights on "
        f"{s.device}, context {kernel.context_limit} tokens)",
        f"  policy    {policy.name} {policy.digest} ({kernel.policy_path})",
        f"  data      {s.data_dir} (database {shown_url(s.resolved_database_url)})",
        f"  keys      {active} active API key{'' if active == 1 else 's'}"
        + ("" if active else ": every route but /healthz needs one: fak keys create --tenant T --role agent"),
        f"  operator  {s.operator_tenant or NO_OPERATOR}",
    ]
    if s.upstreams:
        lines.append(f"  upstreams {', '.join(sorted(s.upstreams))}")
    if s.mcp_servers:
        lines.append(f"  mcp       {', '.join(sorted(s.mcp_servers))} (tools offered once pinned: fak mcp list)")
    if s.approvals_webhook_url:
        lines.append(f"  approvals webhook {s.approvals_webhook_url}")
    if host not in LOOPBACK:
        lines.append("  note      listening beyond loopback: put a TLS proxy in front (docs/deploy.md)")
    return lines


def shown_url(url: str) -> str:
    """A database URL as it may be printed: its password masked."""
    return make_url(url).render_as_string(hide_password=True)
