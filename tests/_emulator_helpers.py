"""A tiny blocking HTTP client and SSE parser for the emulator tests (standard library only, plus the
suite's one fake key), and ``post_all``: JSON bodies POSTed at once (aiohttp), each answer's bytes."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from _common_helpers import FAKE_KEY

KEY = FAKE_KEY  # the one fake key (_common_helpers)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(url: str, method: str = "GET", body: Any = None, *, key: str | None = KEY,
            timeout: float = 30.0) -> Reply:
    """One request on a fresh connection (so a reset or hang affects only this call)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data, headers=headers)
        r = conn.getresponse()
        payload = r.read()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, payload)
    finally:
        conn.close()


def chat(base_url: str, body: dict[str, Any], **kw: Any) -> Reply:
    return request(f"{base_url}/chat/completions", "POST", body, **kw)


def chat_body(content: str = "Explain BPE in one paragraph.", *, stream: bool = False, max_tokens: int | None = 4096,
              **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "qwen/qwen3-8b", "messages": [{"role": "user", "content": content}],
                            "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body.update(extra)
    return body


@dataclass
class Stream:
    comments: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    def text(self, name: str) -> str:
        out = []
        for ev in self.events:
            for ch in ev.get("choices") or []:
                v = (ch.get("delta") or {}).get(name)
                if v:
                    out.append(v)
        return "".join(out)

    @property
    def usage(self) -> dict[str, Any] | None:
        for ev in self.events:
            if ev.get("usage"):
                return dict(ev["usage"])
        return None

    @property
    def finish_reasons(self) -> list[str]:
        return [ch["finish_reason"] for ev in self.events for ch in ev.get("choices") or [] if ch.get("finish_reason")]


def parse_sse(body: bytes) -> Stream:
    s = Stream()
    for block in body.decode("utf-8").split("\n\n"):
        for line in block.split("\n"):
            if not line:
                continue
            if line.startswith(":"):
                s.comments.append(line)
            elif line == "data: [DONE]":
                s.done = True
            elif line.startswith("data: "):
                s.events.append(json.loads(line[6:]))
            else:
                raise AssertionError(f"not an SSE line: {line!r}")
    return s


def post_all(url: str, bodies: list[dict[str, Any]]) -> list[bytes]:
    """POST every body to ``url`` concurrently; each answer's bytes, in order (each must be a 200)."""
    import aiohttp

    async def main() -> list[bytes]:
        async with aiohttp.ClientSession() as s:
            async def one(b: dict[str, Any]) -> bytes:
                async with s.post(url, json=b) as r:
                    assert r.status == 200, await r.text()
                    return await r.read()
            return list(await asyncio.gather(*(one(b) for b in bodies)))
    return asyncio.run(main())
