"""The one bearer-token check (flexinfer_common.auth), which every API's admin calls and the status page use."""

from __future__ import annotations

import pytest

from flexinfer_common.auth import bearer_matches, token_matches

TOKEN = "s3cr3t-admin-token"


@pytest.mark.parametrize(
    ("rule", "header", "allowed"),
    [
        ("the-token", f"Bearer {TOKEN}", True),
        ("the-scheme-in-any-case", f"bearer {TOKEN}", True),
        ("spaces-around-the-token", f"Bearer   {TOKEN} ", True),
        ("as-bytes", f"Bearer {TOKEN}".encode(), True),
        ("no-header", None, False),
        ("empty", "", False),
        ("another-token", "Bearer not-the-token", False),
        ("a-prefix-of-the-token", f"Bearer {TOKEN[:-1]}", False),
        ("the-token-and-more", f"Bearer {TOKEN}x", False),
        ("another-scheme", f"Basic {TOKEN}", False),
        ("no-scheme", TOKEN, False),
        ("the-scheme-only", "Bearer", False),
    ],
)
def test_bearer_matches(rule: str, header: str | bytes | None, allowed: bool) -> None:
    assert bearer_matches(header, TOKEN) is allowed, rule
    assert bearer_matches(header, TOKEN.encode()) is allowed, rule


def test_token_matches_takes_text_or_bytes() -> None:
    assert token_matches(TOKEN, TOKEN.encode()) and token_matches(TOKEN.encode(), TOKEN)
    assert not token_matches("", TOKEN) and not token_matches(TOKEN.upper(), TOKEN)
