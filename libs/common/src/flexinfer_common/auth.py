"""The one bearer-token check of every FlexInfer API (the admin APIs, the proxy's admin calls, the status page).

Both compare in constant time (``hmac.compare_digest``), so a caller cannot learn the token byte by byte from how
long a refusal takes. Pure: no I/O.
"""

from __future__ import annotations

import hmac


def token_matches(given: str | bytes, token: str | bytes) -> bool:
    """Whether ``given`` is ``token``."""
    given_bytes = given.encode() if isinstance(given, str) else given
    token_bytes = token.encode() if isinstance(token, str) else token
    return hmac.compare_digest(given_bytes, token_bytes)


def bearer_matches(authorization: str | bytes | None, token: str | bytes) -> bool:
    """Whether an ``Authorization`` header's value is ``Bearer <token>`` (the scheme in any case)."""
    raw = authorization.encode() if isinstance(authorization, str) else (authorization or b"")
    scheme, _, given = raw.partition(b" ")
    return scheme.lower() == b"bearer" and token_matches(given.strip(), token)
