"""What cft asks of an engine kind, and what an engine's answer to a load or unload means."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol


class HttpReply(Protocol):
    """An engine's whole answer, as the kinds read it (an httpx.Response is one)."""

    @property
    def status_code(self) -> int:
        """The HTTP status."""

    @property
    def text(self) -> str:
        """The body as text."""

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""

    def raise_for_status(self) -> object:
        """Raise httpx.HTTPStatusError for a 4xx or 5xx answer."""


class Http(Protocol):
    """What the kinds call an engine with (an httpx.Client is one; the reconciler passes a
    leaner client of its own). Failures raise httpx.HTTPError."""

    def get(self, url: str, *, timeout: float = ...) -> HttpReply:
        """GET url."""

    def post(self, url: str, *, json: Any = ...) -> HttpReply:
        """POST a JSON body to url."""


def base_ids(payload: object) -> frozenset[str]:
    """The base models in an OpenAI /v1/models response: the entries without a parent (vLLM
    and SGLang list each adapter with its base as parent)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    return frozenset(
        str(m["id"])
        for m in data or []
        if isinstance(m, dict) and isinstance(m.get("id"), str) and not m.get("parent")
    )


EngineKind = Literal["vllm", "sglang", "lorax", "local", "vllm-lazy"]


class Outcome(enum.Enum):
    """What an engine's answer to a load or unload means for the reconciler."""

    DONE = "done"  # loaded / unloaded now
    ALREADY = "already"  # loaded before under this name / already gone
    NO_PATH = "no_path"  # the engine cannot read the adapter's directory
    NO_API = "no_api"  # the engine has no load/unload routes (a setting is missing)
    REFUSED = "refused"  # the engine refused this adapter or request
    FAILED = "failed"  # the engine failed (5xx): try again later


@dataclass(frozen=True)
class Described:
    """What an engine says about itself (None where it does not say)."""

    bases: frozenset[str] | None = None  # the base models it serves
    revision: str | None = None  # the base's weights version
    capacity: int | None = None  # adapters it keeps loaded before evicting
    pin_limit: int = 0  # adapters cft may pin (kept loaded, never evicted)


# The start of a load's message when the engine loaded the adapter but would not pin it.
NOT_PINNED = "loaded, not pinned: "


@dataclass(frozen=True)
class Answer:
    """An Outcome and the readable reason (the engine's own message where it gave one)."""

    outcome: Outcome
    message: str = ""


def json_object(resp: HttpReply) -> dict[str, Any]:
    """The response's body as a JSON object ({} when it is not one)."""
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def failed_or_refused(status: int, message: str) -> Answer:
    """An error answer that is not one the kind reads otherwise: 5xx failed, else refused."""
    outcome = Outcome.FAILED if status >= 500 else Outcome.REFUSED
    return Answer(outcome, f"engine answered {status}: {message}")


class Kind:
    """How cft drives one kind of engine (one instance per kind, in app/engines/kinds.py)."""

    name: ClassVar[EngineKind]
    # False: the reconciler only verifies and stages an adapter's files, and the engine reads
    # them on a call's first use (no load or unload call).
    loads_adapters: ClassVar[bool] = True
    # True (a kind that loads on first use): a retired adapter is unloaded by name all the same,
    # since the engine keeps what a call made it load.
    unloads_staged: ClassVar[bool] = False
    # False: the engine has no /v1/models; it is probed on /health, and what it may be asked
    # for is what the reconciler staged.
    lists_models: ClassVar[bool] = True
    # True: the engine speaks vLLM's load/generate/unload API (the evaluator drives it).
    vllm_api: ClassVar[bool] = False
    # True: an adapter the engine evicted (beyond its capacity) is no longer listed but stays
    # callable: the engine loads it again on the call that names it (SGLang). Its absence from
    # the list is not a loss, and reloading it would only evict another.
    keeps_evicted: ClassVar[bool] = False
    # True: a load may pin the adapter (never evicted); the reconciler pins the hottest prods.
    pins: ClassVar[bool] = False

    @property
    def probe_path(self) -> str:
        """The GET that tells whether the engine is up (and, listing kinds, what it serves)."""
        return "/v1/models" if self.lists_models else "/health"

    def model_fields(
        self, model: str, *, base_model: str, adapter_path: str | None
    ) -> dict[str, str]:
        """The body fields that select `model` (an adapter id, or the route's base model)."""
        return {"model": model}

    def adapter_refused(self, status: int, body: bytes) -> bool:
        """True when an answer to a call for an adapter means "that adapter is not available
        here" (drop it from the engine's list, fall back), not a bad request."""
        return status == 404 or status >= 500

    def describe(self, client: Http, url: str) -> Described:
        """What the engine says about itself: its base models (/v1/models), nothing more by
        default. Raises httpx.HTTPError when it does not answer."""
        if not self.lists_models and not self.vllm_api:
            return Described()
        resp = client.get(url + "/v1/models", timeout=5.0)
        resp.raise_for_status()
        return Described(bases=base_ids(resp.json()) or None)

    def load(self, client: Http, url: str, name: str, path: str, *, pinned: bool = False) -> Answer:
        """Load the adapter in directory `path` under `name` (pinned: never evicted, where
        the kind pins), and say what the answer means."""
        raise NotImplementedError(f"{self.name} engines load adapters on first use")

    def unload(self, client: Http, url: str, name: str) -> Answer:
        """Unload the adapter loaded under `name`, and say what the answer means."""
        raise NotImplementedError(f"{self.name} engines load adapters on first use")
