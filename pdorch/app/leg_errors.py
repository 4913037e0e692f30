"""The native leg client's errors (`leg_client.py`), all `LegClientError`s.

`legs.py` / `pools.health.classify_error` map them to the kinds the flow uses:
`LegConnectError` (refused, unreachable: CONNECTION, engine not reached), `LegConnectTimeout`
(TIMEOUT, not reached), `LegDisconnected` (closed, reset or half-closed before the answer's
end: CONNECTION), `LegProtocolError` (not HTTP/1.x: CONNECTION), `LegDeadline` (TIMEOUT). The
two timeouts are `TimeoutError`s, as aiohttp's are.
"""

from __future__ import annotations


class LegClientError(Exception):
    """A leg failed in the native client (transport or protocol)."""


class LegConnectError(LegClientError):
    """The engine could not be reached (refused, unreachable): it never saw the request."""


class LegConnectTimeout(LegClientError, TimeoutError):
    """No connection within `connect_timeout_s`: the engine never saw the request."""


class LegDisconnected(LegClientError):
    """The connection closed, reset or half-closed before the answer ended."""


class LegProtocolError(LegClientError):
    """The engine's bytes are not an HTTP/1.x answer."""


class LegDeadline(LegClientError, TimeoutError):
    """The leg's whole-answer deadline (`deadline_s`) passed."""
