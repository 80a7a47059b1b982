"""``draftgen emulate --model DIR``: a vLLM-compatible server backed by a real transformers model on CPU.

Routes (server root ``http://HOST:PORT``), shapes as current vLLM (and SGLang for ``/generate``) send them::

    GET  /v1/models, /health, /metrics (Prometheus text: vLLM's spec-decode counters), /server_info
    POST /v1/chat/completions   chat template rendered with ``chat_template_kwargs``; ``return_token_ids``
                                gives ``choices[0].token_ids`` and top-level ``prompt_token_ids``;
                                streamed (SSE, ``stream_options.include_usage``) or whole
    POST /v1/completions        ``prompt`` = ids or text; ``choices[0].text`` / ``token_ids`` /
                                ``prompt_token_ids``; ``prompt_logprobs: k`` gives ``choices[0].prompt_logprobs``
                                (None, then {id: {logprob, rank, decoded_token}} per prompt position); in
                                extract mode also top-level ``kv_transfer_params.hidden_states_path``
    POST /generate              SGLang native; ``meta_info`` gains ``spec_*`` fields with a drafter

A stand-in provider (provider fidelity, ``draftgen extract``): ``provider`` names the server in each chat
completion (and each chunk of a stream, the usage chunk aside) the way OpenRouter does, as a top-level
``provider``; ``perturb`` adds seeded Gaussian noise of that relative scale to every weight after loading
(``engine.perturb_weights``): a "quantized" copy of the target whose text really differs from the target's.

Generation is batched across concurrent requests by ``model_engine.ModelEngine`` (greedy when
``temperature`` is 0 or absent, seeded sampling otherwise; stops on the model's end-of-sequence ids or at
``max_tokens``; without ``max_tokens`` the rest of the context). Reasoning is split off
(``message.reasoning``) only when the output holds the template's end-of-think marker.

``start_in_thread(opts)`` runs it on its own event loop in a daemon thread (tests);
``serve_forever(opts, echo)`` blocks until SIGINT/SIGTERM (the CLI); both on ``backends.serve``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from draftgen.backends import serve
from draftgen.backends.serve import Serving, ThreadedServer
from draftgen.emulator.local_wire import (
    json_body,
    json_response,
    parse_generate,
    send_sse,
    sglang_error,
    vllm_chunk,
    vllm_error,
    vllm_stream_end,
    wants_usage,
)
from draftgen.emulator.real.engine import (
    GenJob,
    GenResult,
    LoadedModel,
    ModelEngine,
    load_model,
    perturb_weights,
)
from draftgen.emulator.real.extract import corrupt
from draftgen.emulator.real.http import Counters, job_of, token_id

if TYPE_CHECKING:
    import torch

    from draftgen.emulator.real.extract import ConnectorWriter
    from draftgen.emulator.real.spec import SpecDecoder

__all__ = ["MAX_LOGPROBS", "ModelServer", "ModelServerOptions", "RunningModelServer", "model_server_options",
           "serve_forever", "start_in_thread"]

#: vLLM's default ``--max-logprobs``: the most alternatives a request may ask for
MAX_LOGPROBS = 20

@dataclass
class ModelServerOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    threads: int = 2
    #: extract mode: the connector's ``shared_storage_path``
    extract_dir: str | None = None
    #: vLLM-convention layer ids to capture (default ``[2, L//2, L-3, L]``)
    extract_layers: list[int] | None = None
    extract_fault: str | None = None
    drafter: str | None = None
    num_speculative_tokens: int = 3
    #: feed the drafter zeroed aux states (the zero-aux ablation of ``draftgen accept --zero-aux-url``)
    zero_aux: bool = False
    #: vLLM's ``--per-request-spec-decode-metrics``: ``summary`` or ``detailed`` adds each request's
    #: ``metrics.speculative_decoding`` to its response (None: off, as vLLM's default)
    per_request_spec_decode_metrics: str | None = None
    max_batch: int = 256
    gather_s: float = 0.01
    stream_chunk_tokens: int = 8
    extra: dict[str, Any] = field(default_factory=dict)
    #: the top-level ``provider`` of each chat completion and chunk (None: not sent, as vLLM)
    provider: str | None = None
    #: relative scale of the seeded Gaussian noise added to every weight after loading (0: the model as is)
    perturb: float = 0.0
    perturb_seed: int = 0


def model_server_options(model: str, *, extract_layers: str | None = None, **kw: Any) -> ModelServerOptions:
    """Options from the CLI's flags: ``extract_layers`` as ``"2,4,5,8"``; ConfigError naming the flag."""
    from draftgen.errors import ConfigError

    layers: list[int] | None = None
    if extract_layers:
        try:
            layers = [int(x) for x in extract_layers.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"emulate --extract-layers {extract_layers!r}: give comma-separated integers, "
                              "e.g. 2,4,5,8") from None
        if not kw.get("extract_dir"):
            raise ConfigError("emulate --extract-layers needs --extract-dir (the connector's shared_storage_path)")
    if kw.get("extract_fault") and not kw.get("extract_dir"):
        raise ConfigError("emulate --extract-fault needs --extract-dir")
    return ModelServerOptions(model=model, extract_layers=layers, **kw)


class ModelServer:
    """The loaded model, its engine, the extract writer and the counters; ``app()`` builds the routes."""

    def __init__(self, opts: ModelServerOptions) -> None:
        from draftgen.emulator.real.extract import FAULTS, ConnectorWriter, capture_ids, known_fault
        from draftgen.errors import ConfigError

        self.opts = opts
        if opts.perturb < 0:
            raise ConfigError(f"emulate --perturb {opts.perturb}: give a relative scale >= 0 (e.g. 0.05)")
        self.lm: LoadedModel = load_model(opts.model, device=opts.device, dtype=opts.dtype, threads=opts.threads,
                                          name=opts.served_model_name)
        if opts.perturb:
            perturb_weights(self.lm.model, opts.perturb, opts.perturb_seed)
        L = self.lm.num_layers
        self.fault = opts.extract_fault or os.environ.get("DRAFTGEN_EMULATE_FAULT") or None
        self.captures = 0
        if self.fault is not None and not known_fault(self.fault):
            raise ConfigError(f"emulate --extract-fault {self.fault!r}: known faults are {', '.join(FAULTS)}")
        self.writer: ConnectorWriter | None = None
        layer_ids: list[int] = []
        if opts.extract_dir:
            layer_ids = sorted(set(opts.extract_layers or [2, L // 2, L - 3, L]))
            bad = [k for k in layer_ids if not 0 <= k <= L]
            if bad:
                raise ConfigError(f"emulate --extract-layers {bad}: layer ids run from 0 to {L} (the model has "
                                  f"{L} layers; id {L} is the last layer's output before the final norm)")
            self.writer = ConnectorWriter(opts.extract_dir)
        self.spec: SpecDecoder | None = None
        if opts.drafter:
            from draftgen.emulator.real.spec import SpecDecoder

            self.spec = SpecDecoder.load(opts.drafter, self.lm, k=opts.num_speculative_tokens, zero_aux=opts.zero_aux)
        elif opts.zero_aux:
            raise ConfigError("emulate --zero-aux needs --drafter (it feeds that drafter zeroed aux states)")
        mode = opts.per_request_spec_decode_metrics
        if mode is not None and mode not in ("summary", "detailed"):
            raise ConfigError(f"emulate --per-request-spec-decode-metrics {mode!r}: give summary or detailed")
        self.counters = Counters(per_pos=[0] * opts.num_speculative_tokens)
        self.engine = ModelEngine(self.lm, layer_ids=capture_ids(self.fault, layer_ids), max_batch=opts.max_batch,
                                  gather_s=opts.gather_s, spec=self.spec)
        self.layer_ids = layer_ids
        tok = self.lm.tokenizer
        self.think_start = token_id(tok, "<think>")
        self.think_end = token_id(tok, "</think>")

    @property
    def name(self) -> str:
        return self.lm.name

    def close(self) -> None:
        self.engine.close()
        if self.writer is not None:
            self.writer.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        r = app.router
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_get("/server_info", self.server_info)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/generate", self.generate)
        return app

    # -- helpers -------------------------------------------------------------------------------------

    async def _run(self, job: GenJob) -> GenResult:
        res = await asyncio.wrap_future(self.engine.submit(job))
        c = self.counters
        c.requests += 1
        c.prompt_tokens += len(job.prompt_ids)
        c.generation_tokens += len(res.ids)
        c.add_spec(res)
        return res

    def _decode(self, ids: list[int]) -> str:
        text: str = self.lm.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def _split(self, ids: list[int]) -> tuple[str | None, str | None]:
        """(reasoning, content) of the output ids: split at the end-of-think marker when it is there."""
        end = self.think_end
        if end is not None and end in ids:
            cut = ids.index(end)
            head = ids[:cut]
            if head and head[0] == self.think_start:
                head = head[1:]
            content = self._decode(ids[cut + 1:])
            return self._decode(head), content or None
        return None, self._decode(ids)

    def _max_tokens(self, body: dict[str, Any], prompt_len: int, default: int | None) -> int | str:
        mt = body.get("max_completion_tokens")
        if mt is None:
            mt = body.get("max_tokens")
        if mt is None:
            mt = default
        ctx = self.lm.max_len
        if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
            return "max_tokens must be a positive integer"
        if prompt_len + (mt or 0) > ctx or prompt_len >= ctx:
            return (f"This model's maximum context length is {ctx} tokens. However, you requested "
                    f"{prompt_len + (mt or 0)} tokens ({prompt_len} in the messages, {mt or 0} in the completion). "
                    "Please reduce the length of the messages or completion.")
        return mt if mt is not None else ctx - prompt_len

    def _modelerror(self, body: dict[str, Any]) -> web.Response | None:
        m = body.get("model")
        if m is not None and m != self.name:
            return vllm_error(404, f"The model `{m}` does not exist.", "model")
        return None

    # -- routes --------------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": self.name, "object": "model", "created": 0, "owned_by": "vllm", "root": self.opts.model,
                 "parent": None, "max_model_len": self.lm.max_len, "permission": []}]
        return json_response({"object": "list", "data": data})

    async def server_info(self, request: web.Request) -> web.Response:
        c = self.counters
        avg = c.spec_completion_tokens / c.verify_calls if c.verify_calls else None
        return json_response({"model_path": self.opts.model, "served_model_name": self.name,
                      "speculative_algorithm": "EAGLE3" if self.spec else None,
                      "draftgen_zero_aux": self.opts.zero_aux,
                      "internal_states": [{"avg_spec_accept_length": avg}]})

    async def metrics(self, request: web.Request) -> web.Response:
        c = self.counters
        lab = f'engine="0",model_name="{self.name}"'
        lines: list[str] = []

        def counter(name: str, help_: str, values: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} counter")
            for labels, v in values:
                lines.append(f"{name}{{{labels}}} {float(v)}")

        counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", [(lab, c.prompt_tokens)])
        counter("vllm:generation_tokens_total", "Number of generation tokens processed.", [(lab, c.generation_tokens)])
        counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", [(lab, c.drafts)])
        counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", [(lab, c.draft_tokens)])
        counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", [(lab, c.accepted)])
        counter("vllm:spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.",
                [(f'{lab},position="{i}"', n) for i, n in enumerate(c.per_pos)])
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        if isinstance(body, str):
            return vllm_error(400, body)
        if (err := self._modelerror(body)) is not None:
            return err
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return vllm_error(400, "messages must be a non-empty list", "messages")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            return vllm_error(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
        tok = self.lm.tokenizer
        try:
            text = tok.apply_chat_template(
                messages, tools=body.get("tools"), tokenize=False,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                continue_final_message=bool(body.get("continue_final_message", False)), **kwargs)
        except Exception as exc:  # a template error is the request's fault, as in vLLM
            return vllm_error(400, f"chat template: {exc}", "messages")
        prompt_ids: list[int] = list(tok.encode(text, add_special_tokens=False))
        mt = self._max_tokens(body, len(prompt_ids), None)
        if isinstance(mt, str):
            return vllm_error(400, mt, "max_tokens")
        job = job_of(body, prompt_ids, mt)
        if isinstance(job, str):
            return vllm_error(400, job)
        res = await self._run(job)
        gen_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        with_ids = body.get("return_token_ids") is True
        usage: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(res.ids),
                                 "completion_tokens": len(res.ids), "prompt_tokens_details": None}
        model_id = self.name
        if body.get("stream") is True:
            return await self._chat_stream(request, body, res, gen_id, created, model_id, prompt_ids, with_ids, usage)
        reasoning, content = self._split(res.ids)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "tool_calls": [], "reasoning": reasoning}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": res.finish_reason,
                  "stop_reason": None, "token_ids": res.ids if with_ids else None}
        return json_response({"id": gen_id, "object": "chat.completion", "created": created, "model": model_id,
                      "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage,
                      "prompt_logprobs": None, "prompt_token_ids": prompt_ids if with_ids else None,
                      "kv_transfer_params": None, **self._metrics(res), **self._provider()})

    def _provider(self) -> dict[str, Any]:
        """``{"provider": name}`` with ``provider`` set (OpenRouter's top-level field), else nothing."""
        return {"provider": self.opts.provider} if self.opts.provider else {}

    def _metrics(self, res: GenResult) -> dict[str, Any]:
        """``{"metrics": {"speculative_decoding": ...}}`` with ``per_request_spec_decode_metrics`` on and a
        drafter serving; else nothing (the response unchanged, as vLLM's)."""
        mode = self.opts.per_request_spec_decode_metrics
        if mode is None or res.spec is None:
            return {}
        from draftgen.emulator.real.spec import request_metrics

        return {"metrics": {"speculative_decoding": request_metrics(res.spec, self.opts.num_speculative_tokens,
                                                                    mode)}}

    def _segments(self, ids: list[int]) -> list[tuple[str, list[int]]]:
        """(field, ids) parts of the output: reasoning ids (markers included) then content ids."""
        end = self.think_end
        if end is not None and end in ids:
            cut = ids.index(end) + 1
            return [("reasoning", ids[:cut]), ("content", ids[cut:])]
        return [("content", ids)]

    async def _chat_stream(self, request: web.Request, body: dict[str, Any], res: GenResult, gen_id: str,
                           created: int, model_id: str, prompt_ids: list[int], with_ids: bool,
                           usage: dict[str, Any]) -> web.StreamResponse:
        def ev(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return vllm_chunk(gen_id, created, model_id, choices, **self._provider(), **extra)

        buf = bytearray(ev([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}], prompt_token_ids=prompt_ids if with_ids else None))
        pending: list[int] = []
        for fld, seg in self._segments(res.ids):
            for part, text in self._text_chunks(seg, fld == "reasoning"):
                pending += part
                if not text:
                    continue
                buf += ev([{"index": 0, "delta": {fld: text}, "logprobs": None, "finish_reason": None,
                            "token_ids": pending if with_ids else None}])
                pending = []
        metrics = self._metrics(res)
        usage_chunk = wants_usage(body)  # the metrics go with the usage, else on the finish chunk
        buf += ev([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": res.finish_reason,
                    "stop_reason": None, "token_ids": pending if with_ids else None}],
                  **({} if usage_chunk else metrics))
        buf += vllm_stream_end(body, usage, gen_id, created, model_id, metrics.get("metrics"))
        return await send_sse(request, bytes(buf))

    def _text_chunks(self, ids: list[int], reasoning: bool) -> list[tuple[list[int], str]]:
        """Split ``ids`` into chunks whose texts concatenate to the segment's text, never cutting a
        character (incomplete bytes are held back, as vLLM's detokenizer does)."""
        if reasoning:
            head = ids[1:] if ids and ids[0] == self.think_start else ids
            inner = head[:-1] if head and head[-1] == self.think_end else head
            final = self._decode(inner)
        else:
            final = self._decode(ids)
        step = max(1, self.opts.stream_chunk_tokens)
        out: list[tuple[list[int], str]] = []
        sent = ""
        last = 0
        for n in range(step, len(ids) + step, step):
            n = min(n, len(ids))
            if n < len(ids):
                part = ids[:n]
                if reasoning:
                    part = part[1:] if part and part[0] == self.think_start else part
                text = self._decode(part)
                if not final.startswith(text) or len(text) < len(sent):
                    continue
            else:
                text = final
            out.append((ids[last:n], text[len(sent):]))
            sent, last = text, n
        return out

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        if isinstance(body, str):
            return vllm_error(400, body)
        if (err := self._modelerror(body)) is not None:
            return err
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            prompt_ids = list(self.lm.tokenizer.encode(prompt, add_special_tokens=False))
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            prompt_ids = list(prompt)
        else:
            return vllm_error(400, "prompt must be a non-empty string or list of token ids (one prompt)", "prompt")
        vocab = int(self.lm.model.config.vocab_size)
        if any(not 0 <= t < vocab for t in prompt_ids):
            return vllm_error(400, f"prompt holds a token id outside the vocabulary [0, {vocab})", "prompt")
        mt = self._max_tokens(body, len(prompt_ids), 16)
        if isinstance(mt, str):
            return vllm_error(400, mt, "max_tokens")
        job = job_of(body, prompt_ids, mt)
        if isinstance(job, str):
            return vllm_error(400, job)
        plp = body.get("prompt_logprobs")
        if plp is not None and (isinstance(plp, bool) or not isinstance(plp, int) or not -1 <= plp <= MAX_LOGPROBS):
            return vllm_error(400, f"prompt_logprobs must be an integer in [-1, {MAX_LOGPROBS}]", "prompt_logprobs")
        job.prompt_logprobs = plp
        rid = f"cmpl-{uuid.uuid4().hex}"
        path: str | None = None
        writer = self.writer
        if writer is not None:
            path = writer.new_path(f"{rid}-0")
            job.capture = True
            target = path

            def on_prefill(j: GenJob, hidden: torch.Tensor | None) -> None:
                assert hidden is not None
                self.captures += 1
                states = corrupt(self.fault, hidden, self.lm.model.model.norm, self.captures) if self.fault else hidden
                writer.submit(target, states, j.prompt_ids, writer.lock(target))

            job.on_prefill = on_prefill
        res = await self._run(job)
        with_ids = body.get("return_token_ids") is True
        shown = list(prompt_ids)
        if self.fault == "prompt_ids" and shown:
            shown[-1] = (shown[-1] + 1) % vocab
        choice = {"index": 0, "text": self._decode(res.ids), "logprobs": None, "finish_reason": res.finish_reason,
                  "stop_reason": None, "token_ids": res.ids if with_ids else None,
                  "prompt_logprobs": self._prompt_logprobs(res), "prompt_token_ids": shown if with_ids else None}
        usage = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(res.ids),
                 "completion_tokens": len(res.ids), "prompt_tokens_details": None}
        return json_response({"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.name,
                      "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage,
                      "kv_transfer_params": {"hidden_states_path": path} if path else None, **self._metrics(res)})

    def _prompt_logprobs(self, res: GenResult) -> list[dict[str, dict[str, Any]] | None] | None:
        """vLLM's ``choices[0].prompt_logprobs``: per prompt position None (the first) or {token id: {logprob,
        rank, decoded_token}}, the prompt token first."""
        if res.prompt_logprobs is None:
            return None
        return [None if pos is None else
                {str(t): {"logprob": lp, "rank": rank, "decoded_token": self._decode([t])} for t, lp, rank in pos}
                for pos in res.prompt_logprobs]

    async def generate(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        body = await json_body(request)
        if isinstance(body, str):
            return sglang_error(body)
        tok = self.lm.tokenizer
        req = parse_generate(body, lambda t: list(tok.encode(t, add_special_tokens=False)), allow_empty_ids=False)
        if isinstance(req, str):
            return sglang_error(req)
        prompts = req.prompts
        jobs: list[GenJob] = []
        for p, sp, mt in zip(prompts, req.sampling, req.max_new, strict=True):
            job = job_of({"temperature": sp.get("temperature"), "top_p": sp.get("top_p"), "top_k": sp.get("top_k"),
                        "seed": sp.get("sampling_seed")}, p, min(mt, max(1, self.lm.max_len - len(p))))
            if isinstance(job, str):
                return sglang_error(job)
            jobs.append(job)
        results = await asyncio.gather(*(self._run(j) for j in jobs))
        payload = [self._sglang_result(p, r, t0) for p, r in zip(prompts, results, strict=True)]
        if req.stream:
            if req.batched:
                return sglang_error("the emulator streams only single prompts")
            buf = bytearray()
            res = results[0]
            step = max(1, self.opts.stream_chunk_tokens)
            for n in range(step, len(res.ids) + step, step):
                part = GenResult(ids=res.ids[:min(n, len(res.ids))], finish_reason=res.finish_reason, spec=res.spec)
                ev = self._sglang_result(prompts[0], part, t0, final=len(part.ids) == len(res.ids))
                buf += b"data: " + msgspec.json.encode(ev) + b"\n\n"
            buf += b"data: [DONE]\n\n"
            return await send_sse(request, bytes(buf))
        return json_response(payload if req.batched else payload[0])

    def _sglang_result(self, prompt_ids: list[int], res: GenResult, t0: float, final: bool = True) -> dict[str, Any]:
        ids = res.ids
        finish: dict[str, Any] | None
        if not final:
            finish = None
        elif res.finish_reason == "stop":
            finish = {"type": "stop", "matched": ids[-1] if ids else None}
        else:
            finish = {"type": "length", "length": len(ids)}
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "prompt_tokens": len(prompt_ids),
                                "completion_tokens": len(ids), "cached_tokens": 0, "finish_reason": finish}
        if final:
            meta["e2e_latency"] = round(time.monotonic() - t0, 6)
        s = res.spec
        if final and s is not None and s.verify_calls > 0:
            k = self.opts.num_speculative_tokens
            meta.update(spec_verify_ct=s.verify_calls, spec_accept_length=len(ids) / s.verify_calls,
                        spec_accept_rate=s.accepted / (s.verify_calls * k) if k else 0.0,
                        spec_num_correct_drafts=s.accepted, spec_num_proposed_drafts=s.draft_tokens)
        return {"text": self._decode(ids), "output_ids": list(ids), "meta_info": meta}


# -- lifecycle ---------------------------------------------------------------------------------------


class RunningModelServer(ThreadedServer):
    """A model server in a background thread: ``with start_in_thread(opts) as srv: srv.root_url ...``"""

    def __init__(self, server: ModelServer, serving: Serving) -> None:
        super().__init__(serving, server.opts.host)
        self.server = server
        self.base_url = self.root_url + "/v1"


def start_in_thread(opts: ModelServerOptions) -> RunningModelServer:
    """Load the model, start serving on a daemon thread; returns once listening."""
    server = ModelServer(opts)
    serving = serve.start_in_thread(server.app, opts.host, opts.port, close=server.close, what="emulate",
                                       thread_name="draftgen-model-server")
    return RunningModelServer(server, serving)


def serve_forever(opts: ModelServerOptions, echo: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM (``draftgen emulate --model``)."""
    server = ModelServer(opts)

    def listening(port: int) -> None:
        lm = server.lm
        echo(f"vLLM-compatible model server: http://{opts.host}:{port}/v1  (model {server.name}: {lm.num_layers} "
             f"layers, hidden {lm.hidden_size}, {str(lm.dtype).replace('torch.', '')}, {opts.device})")
        if server.writer is not None:
            echo(f"extract mode: hidden states of layer ids {server.layer_ids} (vLLM convention) -> "
                 f"{server.writer.root}/<request_id>.safetensors (the client's hidden_states.connector_dir)")
        if server.spec is not None:
            echo(f"drafter {opts.drafter}: {opts.num_speculative_tokens} speculative tokens"
                 + (", fed zeroed aux states (--zero-aux)" if opts.zero_aux else ""))
        echo("Ctrl-C stops")

    serve.serve_until_signal(server.app, opts.host, opts.port, close=server.close, what="emulate",
                                on_listening=listening)
    echo(f"model server stopped: {server.counters.requests} requests")
