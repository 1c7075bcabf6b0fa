"""What ``fak serve`` prints when it starts (``api/startup.py``): where it listens, the model,
the policy with its digest, the data directory and database (a password masked), how many
API keys are active (and how to make the first), the operator; nothing secret."""

from __future__ import annotations

from fak.api.keys import KeyStore
from fak.api.startup import shown_url, summary


def test_the_startup_lines_say_what_was_loaded_and_what_is_missing(kernel) -> None:
    keys = KeyStore.of(kernel)
    text = "\n".join(summary(kernel, keys, "127.0.0.1", 8077))
    assert "http://127.0.0.1:8077/v1" in text and "/console" in text
    assert kernel.model_id in text and f"context {kernel.context_limit} tokens" in text
    assert f"{kernel.policy.name} {kernel.policy.digest}" in text and str(kernel.policy_path) in text
    assert str(kernel.settings.data_dir) in text
    assert "0 active API keys: every route but /healthz needs one: fak keys create" in text
    assert "note" not in text  # loopback: no proxy advice
    key, _ = keys.create("acme", "agent", principal="test")
    text = "\n".join(summary(kernel, keys, "0.0.0.0", 9000))
    assert "1 active API key\n" in text + "\n" and key not in text
    assert "http://127.0.0.1:9000/v1" in text and "(bind 0.0.0.0)" in text
    assert "listening beyond loopback: put a TLS proxy in front" in text


def test_a_database_password_never_shows() -> None:
    assert shown_url("postgresql+psycopg://fak:hunter2@db:5432/fak") == "postgresql+psycopg://fak:***@db:5432/fak"
    assert shown_url("sqlite:////srv/fak/fak.db") == "sqlite:////srv/fak/fak.db"
