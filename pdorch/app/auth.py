"""Client API keys and the admin token (both optional; `coordinator:` in the fleet file).

- Clients: with `api_keys` configured, `/v1/*` needs `Authorization: Bearer <one of them>`;
  missing or unknown → 401 (OpenAI's answer to a bad key). Without keys, no check.
- Admin: with `admin_token` configured, `/admin/*` needs `Authorization: Bearer <token>`;
  missing → 401, wrong → 403. Without a token, admin endpoints are open (bind the coordinator
  to loopback, the default, or set a token).

Keys are compared in constant time (`hmac.compare_digest`). `open_admin_warning` is the loud
warning `run_coordinator` logs at start when admin is open on a non-loopback address.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping

from pdorch.app.errors import ApiError

_BEARER = "bearer "


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer ...` header, or None."""
    return _bearer(headers.get("authorization"))


def _bearer(value: str | None) -> str | None:
    if not value or value[: len(_BEARER)].lower() != _BEARER:
        return None
    return value[len(_BEARER) :].strip() or None


def _known(token: str, accepted: Iterable[str]) -> bool:
    found = False
    for key in accepted:  # no early exit: the time does not say which key nearly matched
        found |= hmac.compare_digest(token.encode(), key.encode())
    return found


def check_client(headers: Mapping[str, str], api_keys: tuple[str, ...]) -> None:
    """Raise 401 unless no keys are configured or the request carries one of them."""
    if api_keys:
        check_client_authorization(headers.get("authorization"), api_keys)


def check_client_authorization(value: str | None, api_keys: tuple[str, ...]) -> None:
    """`check_client` on the request's `Authorization` value (None: not sent), for the raw
    headers of the OpenAI POSTs (`edge_request.authorization`)."""
    if not api_keys:
        return
    token = _bearer(value)
    if token is None:
        raise ApiError(
            401,
            "Missing API key: send 'Authorization: Bearer <key>'.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _known(token, api_keys):
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")


def check_admin(headers: Mapping[str, str], admin_token: str | None) -> None:
    """Raise 401 (no token sent) or 403 (wrong token) when an admin token is configured."""
    if admin_token is None:
        return
    token = bearer_token(headers)
    if token is None:
        raise ApiError(
            401,
            "Admin endpoints need 'Authorization: Bearer <admin token>'.",
            code="missing_admin_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _known(token, (admin_token,)):
        raise ApiError(403, "Wrong admin token.", code="invalid_admin_token")


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves loopback only (`localhost`, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or a wildcard ("", 0.0.0.0, ::) may reach other hosts


def open_admin_warning(host: str, admin_token: str | None) -> str | None:
    """The warning to log at start when `/admin/*` is open (no token) beyond loopback."""
    if admin_token is not None or is_loopback(host):
        return None
    return (
        f"SECURITY: the admin API (/admin/*: add/remove replicas, scale pools) is OPEN on "
        f"{host or '0.0.0.0'} with no admin token: anyone who reaches this address can "
        "reconfigure the fleet. Set coordinator.admin_token in the fleet file, or bind "
        "127.0.0.1."
    )
