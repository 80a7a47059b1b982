"""The one reader of a backend's account and price list, used by ``generate``, ``plan`` and ``probe``.

``read_account(backend, cfg)`` asks what the backend's capabilities (``backends.capabilities``) say it
has, and returns an ``AccountSnapshot``: the key (``GET /key``), the account's credits (``GET /credits``
with ``endpoint.management_key_env``), the model's provider endpoints (``GET /models/{model}/endpoints``)
and the worst-case prices over the endpoints the routing may choose (``pricing.routed_prices``). Each
part is either present, or absent with a reason string saying why. It reads and writes no files and
prints nothing: each command presents the snapshot in its own way.

Error rules, the same for every command:

- a rejected API key (``AuthError`` on ``/key`` or on the endpoint list) is raised: nothing the key cannot
  do is worth planning or probing further; when no key was set at all (the backend's placeholder was sent),
  its message says so and how to set one;
- a model the endpoint list does not know (404, ``model_not_found``) is a ``ConfigError`` naming
  ``model.id``: every request would fail, whatever the budget;
- any other API failure of ``/key``, ``/credits`` or the endpoint list is recorded as the part's reason
  (``key_error``, ``credits_error``, ``endpoints_error``), never raised; a rejected management key is
  such a failure (it says nothing about the API key);
- a backend kind without the capability (``Capabilities.account`` / ``prices``) is not asked; its
  part is absent with no error (``has_account`` / ``has_prices`` false).

The API and management keys are never part of a snapshot or a reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from draftgen.backends import (
    Backend,
    Credits,
    EndpointInfo,
    KeyInfo,
    capabilities,
    management_key_for,
    open_backend,
)
from draftgen.backends.pricing import Prices, routed_prices
from draftgen.errors import APIError, AuthError, ConfigError

if TYPE_CHECKING:
    from draftgen.config import RunConfig

__all__ = ["AccountSnapshot", "read_account", "read_account_at"]


class AccountSnapshot(msgspec.Struct, kw_only=True):
    """What one backend said about the key, the account and the model's prices, or why it said nothing.

    Invariant: a part and its ``*_error`` are never both set; both unset means "not asked" (the backend
    kind lacks the capability, or no management key is configured for credits).
    """

    backend: str
    """The backend's name (``openrouter``, ``vllm``, ...), for messages."""
    has_account: bool = False
    """The kind has ``GET /key`` and ``/credits`` (``Capabilities.account``)."""
    has_prices: bool = False
    """The kind lists a model's endpoints with prices (``Capabilities.prices``)."""
    key: KeyInfo | None = None
    key_error: str | None = None
    management_key: bool = False
    """A management key is configured (``endpoint.management_key_env``), so credits were asked for."""
    credits: Credits | None = None
    credits_error: str | None = None
    endpoints: list[EndpointInfo] | None = None
    endpoints_error: str | None = None
    prices: Prices | None = None
    """Worst-case USD per token over the endpoints the routing may choose; None without endpoints."""
    priced_over: list[str] = msgspec.field(default_factory=list)
    """The endpoints (tag or provider name) ``prices`` was taken over; empty when none serves the model."""

    @property
    def remaining(self) -> float | None:
        """The money the key may still spend: the smaller of its limit remaining and the credits left,
        when either is known."""
        caps = [x for x in (self.key.limit_remaining if self.key else None,
                            self.credits.remaining if self.credits else None) if x is not None]
        return min(caps) if caps else None

    def prices_missing(self, model: str) -> str | None:
        """Why there are no prices (None when there are): the list failed, the backend publishes none,
        or no endpoint serves ``model``."""
        if self.priced_over:
            return None
        if self.endpoints_error is not None:
            return f"the price list could not be read: {self.endpoints_error}"
        if self.endpoints is None:
            return f"the {self.backend} endpoint publishes no prices"
        return f"no endpoint serves {model}"


def _no_key(cfg: RunConfig, exc: AuthError) -> AuthError:
    """A rejected key, said as it is: when no key is set at all (the backend's placeholder was sent), that it
    is not set and how to set it, not that a key was rejected."""
    from draftgen.config import resolve_api_key

    if resolve_api_key(cfg, required=False) is not None:
        return exc
    env = cfg.endpoint.api_key_env
    return AuthError(f"no API key is set ({env} is empty and there is no --api-key-file), and the server at "
                     f"{cfg.endpoint.base_url or cfg.endpoint.kind} wants one: export {env}=<your key> (for "
                     "`draftgen emulate`, the key it was started with), or pass --api-key-file PATH (a file "
                     "holding only the key)", kind="auth", status=exc.status)


async def read_account(backend: Backend, cfg: RunConfig, *, prices: bool = True) -> AccountSnapshot:
    """Read the key, the credits and (``prices``) the model's endpoints and routed prices from an open
    backend, following the module's error rules. Raises AuthError on a rejected API key, and ConfigError
    naming ``model.id`` when the endpoint does not know the model (404, ``model_not_found``)."""
    caps = capabilities(cfg.endpoint.kind)
    snap = AccountSnapshot(backend=backend.name, has_account=caps.account, has_prices=caps.prices)
    if caps.account:
        try:
            snap.key = await backend.get_key_info()
        except AuthError as exc:
            raise _no_key(cfg, exc) from None
        except APIError as exc:
            snap.key_error = str(exc)
        mgmt = management_key_for(cfg)
        if mgmt:
            snap.management_key = True
            try:
                snap.credits = await backend.get_credits(mgmt)
            except APIError as exc:  # a rejected management key too: it is not the API key
                snap.credits_error = str(exc)
    if prices and caps.prices:
        try:
            snap.endpoints = await backend.get_model_endpoints(cfg.model.id)
        except AuthError as exc:
            raise _no_key(cfg, exc) from None
        except APIError as exc:
            if exc.kind == "model_not_found" or exc.status == 404:
                # A wrong slug: every request would fail the same way, whatever the budget settings.
                raise ConfigError(f"model.id {cfg.model.id!r} is not a model {backend.name} knows ({exc}); "
                                  "check model.id (the model's slug, e.g. moonshotai/kimi-k2.5)") from None
            snap.endpoints_error = str(exc)
        if snap.endpoints is not None:
            routed, used = routed_prices(cfg, snap.endpoints)
            if used:
                snap.prices, snap.priced_over = routed, used
    return snap


async def read_account_at(cfg: RunConfig, base_urls: list[str] | None = None) -> AccountSnapshot:
    """``read_account`` over a backend opened for the purpose (two connections; ``base_urls`` overrides
    the configured URLs, e.g. the embedded emulator's)."""
    from draftgen.backends import api_key_for

    async with open_backend(cfg, api_key_for(cfg), base_urls=base_urls, connections=2) as backend:
        return await read_account(backend, cfg)
