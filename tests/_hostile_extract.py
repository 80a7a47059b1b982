"""A hostile vLLM extract server for the tests: a real HTTP man-in-the-middle in front of draftgen's own emulator
(``draftgen emulate --model DIR --extract-dir D``), so that everything it does not attack is honest.

``ExtractMITM(upstream, attack)`` serves ``/v1/models`` and ``/v1/completions`` on a free loopback port and
forwards each to the emulator at ``upstream`` (its root URL). ``attack(n, body, sample_id)`` names what the
n-th completion (from 1) gets; ``sample_ids`` maps a prompt's ids to its sample id (what an attacker who knows
the data set could work out). Each attack waits for the emulator's write to end (it takes the file's ``.lock``
exclusively, as the connector's writer holds it) and alters the file or the response before answering:

- ``None``: honest;
- ``"truncate"``: the file cut to half its bytes (unreadable);
- ``"nokeys"``: the file rewritten without ``token_ids``;
- ``"layers"``: the file rewritten with one more layer per token;
- ``"ids"``: the response's ``prompt_token_ids`` changed at the last position (the file stays the emulator's);
- ``"shift"``: the states of position t+1 stored at t (a shift by one position, finite and well shaped);
- ``"hold"``: the lock kept past ``hold_s`` seconds after the answer (a writer that never finishes in time);
  when the hold ends the file is written again (a late write), then the lock released;
- ``"late"``: the honest answer, sent ``hold_s`` seconds after the emulator's write ended (a slow answer the
  client may stop waiting for while its file is already written).

``rewrite()`` later overwrites every file it named that still exists with NaN states (a server changing a file
after the client checked it). ``bodies`` keeps every completion request as the server received it; ``named``
every path it answered with. Writes only in the connector folder the emulator writes to.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import torch
from aiohttp import web
from safetensors.torch import load_file, save_file

from _common_helpers import AppServer

Attack = Callable[[int, dict[str, Any], str], str | None]
ATTACKS = ("truncate", "nokeys", "layers", "ids", "shift", "hold", "late")


class ExtractMITM(AppServer):
    """See the module docstring."""

    def __init__(self, upstream: str, attack: Attack, *, sample_ids: dict[tuple[int, ...], str] | None = None,
                 hold_s: float = 3.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.attack = attack
        self.sample_ids = sample_ids or {}
        self.hold_s = hold_s
        self.bodies: list[dict[str, Any]] = []
        self.named: list[str] = []
        self.attacked: list[tuple[int, str]] = []
        self.holds: list[threading.Thread] = []
        self.release = threading.Event()  # set: every hold ends now
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.complete)

    async def models(self, _request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as s, s.get(self.upstream + "/v1/models") as r:
            return web.json_response(await r.json(), status=r.status)

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        n = len(self.bodies)
        prompt = body.get("prompt")
        sid = self.sample_ids.get(tuple(prompt), "") if isinstance(prompt, list) else ""
        async with aiohttp.ClientSession() as s, s.post(self.upstream + "/v1/completions", json=body) as r:
            out = await r.json()
            if r.status != 200:
                return web.json_response(out, status=r.status)
        path = (out.get("kv_transfer_params") or {}).get("hidden_states_path")
        kind = self.attack(n, body, sid)
        if path:
            self.named.append(path)
        if kind is None or not path:
            return web.json_response(out)
        self.attacked.append((n, kind))
        if kind == "late":
            await asyncio.sleep(self.hold_s)
            return web.json_response(out)
        if kind == "ids":
            ids = out["choices"][0]["prompt_token_ids"]
            ids[-1] = (ids[-1] + 1) % 1000
            return web.json_response(out)
        fd = await _exclusive(path + ".lock")  # the emulator's write is done; nobody reads until we release
        if kind == "hold":
            t = threading.Thread(target=self._hold, args=(path, fd), daemon=True)
            t.start()
            self.holds.append(t)
            return web.json_response(out)
        try:
            _alter(path, kind)
        finally:
            os.close(fd)
        return web.json_response(out)

    def _hold(self, path: str, fd: int) -> None:
        self.release.wait(self.hold_s)
        try:
            data = load_file(path) if os.path.exists(path) else None
            if data is None:  # the client gave up on it and removed it: a late write brings it back
                data = {"hidden_states": torch.zeros(2, 2, 2), "token_ids": torch.zeros(2, dtype=torch.int64)}
            save_file(data, path)
        finally:
            os.close(fd)

    def rewrite(self) -> int:
        """Overwrite every named file that still exists with NaN states; returns how many."""
        n = 0
        for path in self.named:
            if os.path.exists(path):
                data = load_file(path)
                data["hidden_states"] = torch.full_like(data["hidden_states"], float("nan"))
                save_file(data, path)
                n += 1
        return n

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        for t in self.holds:
            t.join(30)
        super().__exit__(*exc)


async def _exclusive(lock: str) -> int:
    """An fd holding LOCK_EX on ``lock`` (waits, off the loop, for the emulator's writer to release it)."""
    import asyncio

    def take() -> int:
        fd = os.open(lock, os.O_RDWR)
        deadline = time.monotonic() + 60
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise
                time.sleep(0.005)

    return await asyncio.to_thread(take)


def _alter(path: str, kind: str) -> None:
    if kind == "truncate":
        with open(path, "rb") as fh:
            data = fh.read()
        with open(path, "wb") as fh:
            fh.write(data[: len(data) // 2])
        return
    st = load_file(path)
    hs = st["hidden_states"]
    if kind == "nokeys":
        st = {"hidden_states": hs}
    elif kind == "layers":
        st["hidden_states"] = torch.cat([hs, hs[:, -1:]], dim=1)
    elif kind == "shift":
        shifted = hs.clone()
        shifted[:-1] = hs[1:]
        st["hidden_states"] = shifted
    else:
        raise ValueError(kind)
    save_file(st, path)
