"""Who may reach the server: the ``Host`` and ``Origin`` a request names, and its API key.

``Access`` holds the policy; ``Guard`` wraps an ASGI app so that a request is
refused with a 403 in OpenAI's error shape, before any endpoint (or CORS preflight) sees it,
when

- its ``Host`` is not a name of this server: a loopback address or ``localhost`` (and
  ``*.localhost``), the bound address, any address literal when the server binds every
  interface, or a name ``--allowed-host`` adds (``*`` allows every one). A web page that
  rebinds its own domain name to 127.0.0.1 (DNS rebinding) sends that domain as ``Host``;
  a request without ``Host`` (HTTP/1.0 tools) is let through, as browsers always send it;
- it comes from a web page whose origin ``--cors-origin`` does not list: an ``Origin``
  header not listed, or a ``Sec-Fetch-Site`` of ``same-site``/``cross-site`` (a browser's
  request made by another page, which a ``no-cors`` GET sends without ``Origin``).

``client_of(access, authorization)`` checks the ``Authorization`` header (scheme
case-insensitive, as RFC 7235 has it; keys compared in constant time) and names the client:
``""`` when the server has no key, else a short digest of the key that identifies it (never
the key itself), so each key can have its own history and cache.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from localspec.serve.errors import ApiError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ANY = "*"
FOREIGN_FETCH_SITES = frozenset({"same-site", "cross-site"})


@dataclass(frozen=True)
class Access:
    bound: str = "127.0.0.1"  # the address the server listens on
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host
    cors_origins: tuple[str, ...] = ()  # --cors-origin
    keys: tuple[str, ...] = ()  # --api-key / --api-key-file / LOCALSPEC_API_KEY
    _ids: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def host_allowed(self, header: str | None) -> bool:
        if header is None or ANY in self.allowed_hosts:
            return True
        name = host_name(header)
        if name is None:
            return False
        if name in {h.lower().rstrip(".") for h in self.allowed_hosts}:
            return True
        if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
            return True
        bound = self.bound.lower().strip("[]")
        if name == bound:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False  # a name nobody allowed: possibly a rebound domain
        # An address literal cannot be rebound; one of another interface of this machine
        # reaches the server only when it binds them all.
        return address.is_loopback or bound in ("0.0.0.0", "::")

    def origin_allowed(self, origin: str | None, fetch_site: str | None) -> bool:
        listed = {o.lower().rstrip("/") for o in self.cors_origins}
        if origin is not None:
            return ANY in listed or origin.lower().rstrip("/") in listed
        # Without Origin, a browser still says whether another page made the request.
        return fetch_site is None or fetch_site.lower() not in FOREIGN_FETCH_SITES

    def client_id(self, key: str) -> str:
        """A stable name for a key that does not reveal it."""
        found = self._ids.get(key)
        if found is None:
            found = hashlib.sha256(b"localspec client " + key.encode()).hexdigest()[:16]
            self._ids[key] = found
        return found


def host_name(header: str) -> str | None:
    """The name or address of a ``Host`` header, lower case, without port or brackets;
    None when it is not one."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not _is_port(value[end + 1 :])):
            return None
        return value[1:end] or None
    name, colon, port = value.rpartition(":")
    if not colon:
        name = value
    elif ":" in name or not port.isdigit():
        return None  # an IPv6 address must be bracketed; a port is digits
    name = name.rstrip(".")
    return name or None


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit()


def client_of(access: Access, authorization: str | None) -> str:
    """The client a request speaks for (see the module docstring); a 401 ``ApiError`` when
    a key is needed and the header does not carry one of them."""
    if not access.keys:
        return ""
    scheme, _, given = (authorization or "").strip().partition(" ")
    given = given.strip()
    matched = None
    if scheme.lower() == "bearer" and given:
        for key in access.keys:  # every key compared: the time does not say which matched
            if hmac.compare_digest(given.encode(), key.encode()):
                matched = key
    if matched is not None:
        return access.client_id(matched)
    raise ApiError(
        401,
        "missing or wrong API key: send Authorization: Bearer KEY",
        type="authentication_error",
        code="invalid_api_key",
    )


class Guard:
    """ASGI middleware: ``app`` behind the ``Host`` and ``Origin`` checks of the module
    docstring, with the policy ``access()`` gives at each request."""

    def __init__(self, app: AsgiApp, access: Callable[[], Access]) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = refusal_for(self.access(), scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await _send_error(send, refusal)


def refusal_for(access: Access, scope: Scope) -> ApiError | None:
    """Why a request may not reach the server, or None."""
    headers = _headers(scope)
    if not access.host_allowed(headers.get("host")):
        return ApiError(
            403,
            f"Host {headers.get('host')!r} is not a name of this server; start it with "
            "--allowed-host NAME to answer to that name",
            code="host_not_allowed",
        )
    if not access.origin_allowed(headers.get("origin"), headers.get("sec-fetch-site")):
        who = headers.get("origin") or "another site"
        return ApiError(
            403,
            f"requests from web pages at {who} are refused; start the server with "
            "--cors-origin ORIGIN to allow a page of yours",
            code="origin_not_allowed",
        )
    return None


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name; a repeated Host or Origin is kept as an
    impossible value, so that it is refused rather than one copy believed."""
    found: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name in found and name in ("host", "origin"):
            value = "\0repeated"
        found[name] = value
    return found


async def _send_error(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
