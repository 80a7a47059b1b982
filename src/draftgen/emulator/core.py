"""The emulator's shared core: options, the loaded model, state, auth, prompt cache, faults, ground truth.

One ``EmulatorCore`` lives per server; handlers reach it through ``request.app[CORE]``. It owns:

- the ``EmulatedModel`` (profile loaded once per process and shared between servers);
- ``EmulatorState`` (credits, counters), the ground-truth JSONL writer (``GroundTruthRecord`` per
  delivered generation, written through ``store.JsonlWriter``, not fsynced per line);
- request identity: ``request_key`` hashes (prompt, model, sampling); ``next_attempt`` counts how often a
  key was seen, and fault/timing draws are pure functions of (seed, key, attempt, provider), so a
  fixed seed reproduces a run and retries draw afresh.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from draftgen.emulator.accounting import EmulatorState
from draftgen.emulator.envelopes import ApiError
from draftgen.emulator.scenarios import ALL_FAULT_KINDS, Provider, Scenario, load_scenario
from draftgen.emulator.scripted import EmulatedModel, Output, stable_hash
from draftgen.errors import DraftgenError
from draftgen.records import GroundTruthRecord, Message, Tool
from draftgen.store import JsonlWriter
from draftgen.tokens import load_profile
from draftgen.tokens.profile import Profile

__all__ = ["CORE", "EmulatorCore", "EmulatorOptions", "emulator_key", "shared_profile"]


@dataclass
class EmulatorOptions:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    scenario: str = "fast"  # fast | realistic | chaos | path to a YAML scenario file
    seed: int = 0
    ground_truth: str | None = None  # append GroundTruthRecord per delivered generation
    api_key: str | None = None  # accept only this key (default: any key starting "sk-or-")
    management_key: str | None = None  # the key allowed to read /credits
    credits: float = 100.0
    profile: str = "qwen3"
    tokenizer: str = "bundled:qwen3"
    scenario_obj: Scenario | None = None  # a Scenario built in Python; wins over ``scenario``
    generation_lag_s: float | None = None  # /generation 404 lag; None: scenario's, time-scaled
    in_flight_budget_usd: float | None = None  # None: scenario's
    thinking: bool = True  # the profile variant when a request does not switch reasoning off
    profile_obj: Profile | None = None  # an already loaded profile (embedding); wins over profile/tokenizer


def emulator_key(path: str | None, env: str, *, flag: str) -> str | None:
    """A key for ``EmulatorOptions.api_key``/``management_key`` (``draftgen emulate``): the content of the file
    ``path`` (holding only the key), else environment variable ``env``, else None. Keys never come from the
    command line, and no message here ever holds one."""
    import os

    from draftgen.errors import ConfigError

    if path:
        where = Path(path).expanduser()
        try:
            key = where.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise ConfigError(f"{flag} {path}: cannot read the key file; check the path and permissions, "
                              f"or set {env} to the key") from None
        if not key:
            raise ConfigError(f"{flag} {path}: the key file is empty")
        if len(key.split()) > 1:
            raise ConfigError(f"{flag} {path}: the key file must hold only the key (one line, nothing else)")
        return key
    return os.environ.get(env, "").strip() or None


_PROFILES: dict[tuple[str, str, bool], Profile] = {}
_PROFILES_LOCK = threading.Lock()


def shared_profile(name: str, tokenizer: str, thinking: bool = True) -> Profile:
    """Load a profile once per process (tests and embedded servers start many emulators)."""
    key = (name, tokenizer, thinking)
    with _PROFILES_LOCK:
        p = _PROFILES.get(key)
        if p is None:
            p = load_profile(name, tokenizer, thinking=thinking)
            _PROFILES[key] = p
        return p


class EmulatorCore:
    def __init__(self, opts: EmulatorOptions) -> None:
        self.opts = opts
        sc = opts.scenario_obj or load_scenario(opts.scenario)
        self.scenario = sc.validate(f"scenario {sc.name!r}")
        self.seed = opts.seed
        profile = opts.profile_obj or shared_profile(opts.profile, opts.tokenizer, opts.thinking)
        self.model = EmulatedModel(profile, self.scenario, opts.seed)
        self.state = EmulatorState(credits_total=opts.credits)
        sc = self.scenario
        self.generation_lag_s = opts.generation_lag_s if opts.generation_lag_s is not None \
            else sc.scaled(sc.generation_lag_s)
        self.in_flight_budget = opts.in_flight_budget_usd if opts.in_flight_budget_usd is not None \
            else sc.in_flight_budget_usd
        self._first_request: float | None = None  # monotonic time of the first chat request (the storm's clock)
        self._attempts: Counter[int] = Counter()
        self._faulty: Counter[int] = Counter()
        self._prompts: OrderedDict[bytes, list[int]] = OrderedDict()
        self._counter = 0
        self._id_salt = time.time_ns()
        self._check_prompt_rendering()  # before anything that needs closing is opened
        self.gt: JsonlWriter | None = JsonlWriter(Path(opts.ground_truth), fsync=False) if opts.ground_truth else None
        # Pool misses are generated off the event loop (one worker: the sample caches see one writer).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftgen-emulator-gen")

    def _check_prompt_rendering(self) -> None:
        # Fail at start-up (one line, via the CLI) rather than on every request.
        self.model.profile(self.opts.thinking).prompt_ids([Message(role="user", content="ping")])

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.gt is not None:
            self.gt.close()
            self.gt = None

    # -- auth ---------------------------------------------------------------------------------------

    def authorize(self, request: web.Request) -> str | ApiError:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            return ApiError(401, "No auth credentials found", "authentication")
        key = header[7:].strip()
        ok = key == self.opts.api_key if self.opts.api_key else key.startswith("sk-or-")
        if not ok and key != self.opts.management_key:
            return ApiError(401, "User not found.", "authentication")
        return key

    def is_management(self, key: str) -> bool:
        return self.opts.management_key is not None and key == self.opts.management_key

    # -- prompts ------------------------------------------------------------------------------------

    def prompt(self, messages: Any, tools: Any, thinking: bool) -> tuple[bytes, list[int]] | ApiError:
        """(prompt hash, prompt ids) of a chat request; cached by the messages' JSON."""
        if not isinstance(messages, list) or not messages:
            return ApiError(400, "messages must be a non-empty array", "invalid_request")
        try:
            raw = msgspec.json.encode([messages, tools, thinking])
        except TypeError as exc:
            return ApiError(400, f"messages are not valid JSON values ({exc})", "invalid_request")
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        ids = self._prompts.get(digest)
        if ids is None:
            try:
                msgs = msgspec.convert(messages, list[Message])
                tls = msgspec.convert(tools, list[Tool]) if tools else None
            except msgspec.ValidationError as exc:
                return ApiError(400, f"invalid messages: {exc}", "invalid_request")
            try:
                ids = self.model.profile(thinking).prompt_ids(msgs, tls)
            except DraftgenError as exc:
                return ApiError(400, f"the chat template could not render these messages: {exc}", "invalid_prompt")
            self._prompts[digest] = ids
            if len(self._prompts) > 4096:  # retries and repeats hit; a run's distinct prompts need not
                self._prompts.popitem(last=False)
        return digest, ids

    async def output(self, key: int, *, thinking: bool, max_tokens: int) -> Output:
        """The model's output for request hash ``key``: a cache hit, or generated in the worker thread."""
        out = self.model.lookup(key, thinking=thinking, max_tokens=max_tokens)
        if out is None:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(
                self._executor, functools.partial(self.model.produce, key, thinking=thinking, max_tokens=max_tokens))
            self.model.remember(key, thinking=thinking, max_tokens=max_tokens, out=out)
        return out

    # -- identity, attempts, faults -----------------------------------------------------------------

    def storm_retry_after(self) -> float | None:
        """The Retry-After of the scenario's rate-limit storm when a request arriving now falls in it, else
        None (``Scenario.storm_s``, counted from the first chat request)."""
        sc = self.scenario
        now = time.monotonic()
        if self._first_request is None:
            self._first_request = now
        if sc.storm_s is None:
            return None
        start, length = sc.storm_s
        since = now - self._first_request
        if sc.scaled(start) <= since < sc.scaled(start + length):
            return sc.scaled(sc.storm_retry_after_s)
        return None

    def next_attempt(self, key: int) -> int:
        n = self._attempts[key]
        self._attempts[key] = n + 1
        return n

    def uniform(self, *parts: object) -> float:
        return stable_hash(self.seed, *parts) / 2.0**64

    def draw_fault(self, provider: Provider, key: int, attempt: int) -> str | None:
        if provider.fault_total <= 0:
            return None
        cap = self.scenario.max_faulty_attempts
        if cap is not None and self._faulty[key] >= cap:
            return None
        u = self.uniform("fault", key, attempt, provider.tag)
        for kind in ALL_FAULT_KINDS:
            u -= provider.faults.get(kind, 0.0)
            if u < 0:
                return kind
        return None

    def note_fault(self, key: int, kind: str) -> None:
        self._faulty[key] += 1
        self.state.by_fault[kind] += 1

    def new_generation_id(self) -> str:
        self._counter += 1
        h = stable_hash("gen", self.seed, self._id_salt, self._counter)
        return f"gen-{int(time.time())}-{_b62(h)}"

    def write_ground_truth(self, gen_id: str, output_ids: list[int], prompt_ids: list[int], non_canonical: bool) -> None:
        if self.gt is not None:
            self.gt.write(GroundTruthRecord(generation_id=gen_id, output_ids=output_ids, prompt_ids=prompt_ids,
                                            non_canonical=non_canonical))


_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _b62(n: int) -> str:
    out = []
    while n:
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return "".join(out).ljust(11, "0")


CORE = web.AppKey("core", EmulatorCore)
