"""``draftgen train --online`` (``train.online``): a drafter trained on hidden states generated on demand by vLLM
extract servers, checked on their way to the trainer, and never stored by draftgen.

``train_online`` is what ``run.run_train`` runs with ``train.online``. Reads the merged train rows (``merged/``,
through ``target.rows``), the target's folder (``train.verifier`` / ``hidden_states.model``) and the servers
(``hidden_states.base_urls``, their shared ``hidden_states.connector_dir``, as the vllm extract backend:
docs/extract.md). Writes ``train/online/`` (speculators' Arrow dataset of the rows, ``token_freq.pt`` and
``sample_ids.jsonl``, by the one writer of them, ``hidden.speculators``; then ``online.json``: what they were made
from) and what offline ``train`` writes (``vocab/``, ``checkpoints/``, ``drafter/``, ``log.jsonl``,
``train.json`` with its ``online`` part).

1. Preflight, before any training step: every server runs ``train.online_check_rows`` rows (evenly spaced over
   the merged order) through the full capture check: exact ids (the vllm backend's own, ``target.vllm``),
   every per-sample check and the log-prob check against its ``prompt_logprobs`` (``target.checks``). A
   server that fails it stops the run, named with the check, before speculators starts. Then provider
   fidelity, as extract measures it (``target.fidelity``): of each provider's rows,
   ``hidden_states.fidelity_samples`` captured through the first server and scored through the target's head;
   the table is printed and kept in train.json's ``online.fidelity`` (``status`` shows it), and under
   ``hidden_states.fidelity_action: exclude`` a flagged provider's rows are left out of speculators' dataset
   (train.json's ``excluded``, "fidelity: <provider>").
2. The checking proxy (``proxy``) starts on a loopback port in front of all the servers (first
   sweeping what a killed run left: the connector files its requests were named, claimed in
   ``train/connector-claims/``, and its copies in ``train/handover/``); speculators gets it as
   ``--vllm-endpoint`` with ``--on-missing generate``: each sample it consumes is generated through a server,
   its file read once and removed from the server's folder, checked like an offline sample (the log-prob check
   on the samples drawn after the answer, with a secret: every request asks for ``prompt_logprobs``), and
   handed over (a copy of the very bytes checked in ``train/handover/``, which no server can write, deleted by
   the trainer once loaded) or excluded (never trained on, counted by check or kind: an unreadable file, one
   of the wrong shape or layer count is ``bad_hidden_states``). Files waiting for the trainer or being
   captured are bounded: at most ``MAX_FILES``, taking at most ``train.online_window_mb``; the proxy removes
   any left when it stops.
3. Training, resume (from the last complete checkpoint) and the report are offline ``train``'s
   (``trainer.train_prepared``); train.json's ``online`` names the servers and their models, the
   rows' digest, the preflight, and the requests, passes and exclusions. The drafter is not published (exit 3,
   ``_Session.refusal``) when a server failed the log-prob spot check (the proxy then stops handing samples,
   so speculators stops too: the run fails naming the server, the check and the sample), or when over
   ``hidden_states.max_flagged_fraction`` of the requests were excluded.

Checkpoints trained on other rows are refused unless ``--restart`` (online.json's digest).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from draftgen.errors import APIError, ConfigError, DraftgenError, InputError, StorageError, ThresholdBroken
from draftgen.phases import Echo
from draftgen.records import HiddenFidelity, TrainOnlineReport, TrainReport

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.phases.train.proxy import CheckingProxy
    from draftgen.rundir import RunDir
    from draftgen.target import ExtractRow, TargetInfo

__all__ = ["FIDELITY_BATCH", "MAX_FILES", "train_online"]

#: connector files on disk at once, at most, whatever their bytes (a request waits for room): two batches'
#: samples for the runner's fetch and prefetch (``speculators_runner.FETCH_THREADS``) on short rows
MAX_FILES = 16
#: rows captured at once for provider fidelity (each capture's states are held until it is scored)
FIDELITY_BATCH = 8


def _servers(cfg: RunConfig) -> list[str]:
    from draftgen.backends import capabilities

    hs, ep = cfg.hidden_states, cfg.endpoint
    urls = [str(u) for u in hs.base_urls]
    if not urls and capabilities(ep.kind).hidden_states:
        urls = [u for u in [ep.base_url, *ep.base_urls] if u]
    if not urls:
        raise ConfigError("hidden_states.base_urls: empty; train --online needs the vLLM servers running "
                          "extract_hidden_states (docs/extract.md, the vllm backend)")
    return urls


def train_online(cfg: RunConfig, rd: RunDir, echo: Echo, restart: bool) -> TrainReport:
    """Train the drafter online in the run directory ``rd`` holds (see the module docstring)."""
    from draftgen.hidden.algorithms import select
    from draftgen.phases.train.launch import ONLINE_FLAG, SELECT_FLAG, find_speculators_python
    from draftgen.phases.train.proxy import CheckingProxy
    from draftgen.phases.train.trainer import Prepared, norm_digest, train_prepared, verifier_path
    from draftgen.target.identity import identity_of, target_weights
    from draftgen.target.rows import read_merged_rows
    from draftgen.target.vllm import VllmExtractBackend

    tc = cfg.train
    python = find_speculators_python(tc.speculators)
    verifier = verifier_path(cfg)
    rows = read_merged_rows(rd)
    urls = _servers(cfg)
    info, models, checks = _preflight(cfg, rows, urls, echo, rd.train_connector_claims)
    if (identity_of(info).norm_weight_sha256 != norm_digest(verifier)
            or target_weights(cfg).differs(target_weights(cfg, verifier))):
        raise ConfigError(f"train.verifier {str(verifier)!r} is not the target the servers serve "
                          f"(hidden_states.model {cfg.hidden_states.model!r}): their final norms or weights "
                          "differ; point both at the folder of the model the servers run")
    rows, fidelity, left_out = _fidelity(cfg, rd, rows, urls[0], echo)
    ids, slots = select(tc.algorithm, info.layers.aux, info.num_layers, tc.layer_ids)
    data, digest = _write_inputs(rd, rows, restart, urls, echo)
    runner = [ONLINE_FLAG] + ([SELECT_FLAG, ",".join(map(str, slots))]
                              if slots != list(range(len(info.layers.aux))) else [])
    backend = VllmExtractBackend(cfg, claims=str(rd.train_connector_claims))
    with CheckingProxy(backend, cfg.hidden_states, rows, model_name=str(verifier), handover=rd.train_handover,
                       max_files=MAX_FILES, window_bytes=int(tc.online_window_mb * 1e6)) as proxy:
        if proxy.stats.swept:
            echo(f"train: online: removed {proxy.stats.swept} file(s) an interrupted run left (connector files its "
                 f"requests were named, copies in {rd.train_handover})")
        spec = ["--on-missing", "generate", "--vllm-endpoint", proxy.url, "--generation-validation-retries", "0",
                "--request-timeout", str(cfg.endpoint.request_timeout_s or cfg.endpoint.idle_timeout_s)]
        prep = Prepared(python=python, verifier=verifier, data=data, samples=len(rows),
                        source="online: " + ", ".join(urls), fingerprint=digest, layer_ids=ids,
                        norm_sha256=norm_digest(verifier), runner_flags=runner, speculators_flags=spec,
                        excluded={f"fidelity: {p}": n for p, n in left_out.items()})
        session = _Session(proxy, urls, models, rows, digest, checks, tc.online_check_rows,
                           cfg.hidden_states.max_flagged_fraction, rd, fidelity)
        echo(f"train: online through {proxy.url} (checking proxy) in front of {len(urls)} server(s): "
             + ", ".join(f"{u} ({m})" for u, m in zip(urls, models, strict=True)))
        try:
            return train_prepared(cfg, rd, echo, prep, restart=restart, session=session)
        except ThresholdBroken:
            raise
        except DraftgenError as exc:  # the trainer stopped: because the proxy stopped handing samples?
            why = session.refusal()
            if why is None:
                raise
            raise ThresholdBroken(f"{why} (the trainer stopped: {str(exc)[:200]})") from None
        finally:
            session.summary(echo)


def _picked(rows: Sequence[ExtractRow], n: int) -> list[ExtractRow]:
    if n >= len(rows):
        return list(rows)
    return [rows[round(i * (len(rows) - 1) / max(n - 1, 1))] for i in range(n)]


def _preflight(cfg: RunConfig, rows: Sequence[ExtractRow], urls: list[str], echo: Echo,
               claims: Path) -> tuple[TargetInfo, list[str], list[str]]:
    """Every server through the full capture check on the picked rows (see the module docstring): the
    target's info, the servers' model ids and the checks that ran; a DraftgenError naming a failing server."""
    from draftgen.phases.train.proxy import check_captured
    from draftgen.target.checks import CHECKS
    from draftgen.target.vllm import VllmExtractBackend

    picked = _picked(rows, cfg.train.online_check_rows)
    models: list[str] = []
    info: TargetInfo | None = None
    for url in urls:
        be = VllmExtractBackend(cfg, base_urls=[url], teacher_fraction=1.0, claims=str(claims))
        try:
            models.append(be.served_models()[0])
            failed: Counter[str] = Counter()
            first: dict[str, str] = {}
            for row, cap in zip(picked, be.capture(picked), strict=True):
                for name in check_captured(be, cfg.hidden_states, row, cap, teacher=True).failed:
                    failed[name] += 1
                    first.setdefault(name, row.sample_id)
            info = be.info
        except (APIError, StorageError) as exc:
            raise DraftgenError(f"train --online: server {url} fails the capture check: {exc}") from None
        finally:
            be.close()
        if failed:
            what = ", ".join(f"{n} on {k} of {len(picked)} rows (e.g. {first[n]})" for n, k in failed.most_common())
            raise DraftgenError(f"train --online: server {url} fails the capture check: {what}; nothing was "
                                "trained. Serve the target with the layer ids draftgen expects (docs/extract.md) "
                                "or take it out of hidden_states.base_urls")
    assert info is not None
    echo(f"train: online preflight: {len(urls)} server(s) passed the capture check on {len(picked)} rows each "
         "(exact ids, per-sample checks, log-prob check against prompt_logprobs)")
    ran = [c for c in CHECKS if c not in ("reference_aux", "reference_final")]  # no plain forward online
    return info, models, ran


def _fidelity(cfg: RunConfig, rd: RunDir, rows: list[ExtractRow], url: str,
              echo: Echo) -> tuple[list[ExtractRow], HiddenFidelity | None, dict[str, int]]:
    """Provider fidelity before training (see the module docstring), measured through the server ``url``: the
    rows to train on, the figures (None: none measured) and the rows left out per flagged provider."""
    from draftgen.phases.train.proxy import check_captured
    from draftgen.runview.chain import fidelity_lines
    from draftgen.target.fidelity import choose, summarize_results
    from draftgen.target.rows import read_merged_providers
    from draftgen.target.vllm import VllmExtractBackend

    hs = cfg.hidden_states
    providers = read_merged_providers(rd)
    measure = choose(rows, providers, hs.fidelity_samples)
    picked = [dataclasses.replace(r, fidelity=True) for r in rows if r.sample_id in measure]
    if not picked:
        return rows, None, {}
    # the spot check's own settings: a fidelity request looks like every other (each asks prompt_logprobs)
    be = VllmExtractBackend(cfg, base_urls=[url], claims=str(rd.train_connector_claims))
    results = {}
    lost: list[str] = []  # a measurement, not a check: a batch the server fails is left unmeasured (the proxy
    try:                  # checks every sample trained on)
        for i in range(0, len(picked), FIDELITY_BATCH):
            batch = picked[i:i + FIDELITY_BATCH]
            try:
                caps = be.capture(batch)
            except (APIError, StorageError) as exc:
                lost += [f"{len(batch)} rows: {str(exc)[:200]}"]
                continue
            for row, cap in zip(batch, caps, strict=True):
                res = check_captured(be, hs, row, cap, teacher=False, fidelity=True)
                if not res.failed and res.fidelity is not None:
                    results[row.sample_id] = res.fidelity
    finally:
        be.close()
    if lost:
        echo(f"train: provider fidelity: {len(lost)} batch(es) of rows could not be captured through {url} and "
             f"are not measured (first: {lost[0]})")
    fid = summarize_results(results, (r.sample_id for r in rows), providers, hs)
    if fid is None:
        return rows, None, {}
    for line in fidelity_lines(fid):
        echo(line)
    left_out = {p.provider: len(p.excluded_sample_ids) for p in fid.providers if p.excluded_sample_ids}
    gone = {sid for p in fid.providers for sid in p.excluded_sample_ids}
    keep = [r for r in rows if r.sample_id not in gone]
    if not keep:
        raise InputError(f"{rd.merged}: every merged row is of a provider the fidelity check flagged "
                         "(hidden_states.fidelity_action: exclude); nothing is left to train on: generate with "
                         "another provider, or set fidelity_action: warn")
    for provider, n in left_out.items():
        echo(f"train: left out {n} rows of provider {provider}: the fidelity check flagged it "
             "(hidden_states.fidelity_action: exclude)")
    return keep, fid, left_out


def _rows_digest(rows: Sequence[ExtractRow]) -> str:
    from draftgen.hidden.codec import row_digest

    h = hashlib.sha256()
    for r in rows:
        h.update(row_digest(r.input_ids, r.loss_mask).encode())
    return h.hexdigest()


def _write_inputs(rd: RunDir, rows: Sequence[ExtractRow], restart: bool, urls: list[str],
                  echo: Echo) -> tuple[Path, str]:
    """``train/online/`` for these rows (left as it is when it already is of them); refuses checkpoints of
    other rows unless ``restart``. Returns the folder and the rows' digest."""
    from draftgen.hidden.speculators import SpeculatorsInputs
    from draftgen.phases.train.launch import last_complete
    from draftgen.store import atomic_write_json, read_json

    out, path = rd.train_online, rd.train_online_report
    digest = _rows_digest(rows)
    old = read_json(path, TrainOnlineReport) if path.is_file() else None
    if old is not None and old.rows_sha256 != digest and not restart and last_complete(rd.train_checkpoints):
        raise InputError(f"{rd.train_checkpoints}: these checkpoints were trained on other rows; rerun with "
                         "--restart to train from scratch on the merged rows as they are now")
    if old is not None and old.rows_sha256 == digest:
        return out, digest
    out.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    inputs = SpeculatorsInputs(narrow=True)
    for r in rows:
        inputs.add(r.input_ids.tolist(), r.loss_mask.tolist(), r.sample_id)  # no state file: generated on demand
    inputs.write(out, listing=True)
    atomic_write_json(path, TrainOnlineReport(servers=urls, server_models=[], rows=len(rows), rows_sha256=digest,
                                              preflight_rows=0, preflight_checks=[]))
    echo(f"train: online inputs for {len(rows)} merged rows in {out} (no hidden states stored)")
    return out, digest


class _Session:
    """train_prepared's session: the proxy's figures as train.json's ``online`` part, and the refusal to publish
    a drafter (``refusal``: a server caught by the log-prob spot check, or over ``max_flagged_fraction`` of the
    samples excluded)."""

    def __init__(self, proxy: CheckingProxy, urls: list[str], models: list[str], rows: Sequence[ExtractRow],
                 digest: str, checks: list[str], preflight_rows: int, max_flagged: float, rd: RunDir,
                 fidelity: HiddenFidelity | None) -> None:
        self.proxy, self.urls, self.models, self.checks = proxy, urls, models, checks
        self.rows, self.digest, self.preflight_rows = len(rows), digest, min(preflight_rows, len(rows))
        self.max_flagged, self.rd, self.fidelity = max_flagged, rd, fidelity

    def report(self) -> TrainOnlineReport:
        s = self.proxy.stats
        return TrainOnlineReport(servers=self.urls, server_models=self.models, rows=self.rows,
                                 rows_sha256=self.digest, preflight_rows=self.preflight_rows,
                                 preflight_checks=self.checks, requests=s.requests, passed=s.passed,
                                 excluded=s.excluded, excluded_by_check=dict(s.excluded_by_check),
                                 excluded_ids=list(s.excluded_ids), teacher_checked=s.teacher_checked,
                                 peak_files=s.peak_files, peak_bytes=s.peak_bytes,
                                 window_bytes=self.proxy.window_bytes, fidelity=self.fidelity)

    def refusal(self) -> str | None:
        """Why the drafter must not be published (None: it may): the proxy stopped (a server failed the
        log-prob spot check), or more than ``hidden_states.max_flagged_fraction`` of the samples asked for were
        excluded (they were not trained on)."""
        s = self.proxy.stats
        if s.fatal is not None:
            return s.fatal
        if s.requests and s.excluded / s.requests > self.max_flagged:
            kind, example = next(((k, m) for k, m in s.examples.items() if m), ("", ""))
            return (f"train --online: {s.excluded} of {s.requests} samples failed a check "
                    f"({dict(s.excluded_by_check)}), over hidden_states.max_flagged_fraction {self.max_flagged}; "
                    f"they were not trained on and no drafter is published"
                    + (f"; e.g. {kind}: {example}" if example else "") + f". See {self.rd.train_report}")
        return None

    def summary(self, echo: Echo) -> None:
        s = self.proxy.stats
        echo(f"train: online: {s.requests} samples asked for, {s.passed} passed the checks, {s.excluded} "
             f"excluded ({dict(s.excluded_by_check) or 'none'}), {s.teacher_checked} log-prob checked; at most "
             f"{s.peak_files} files, {s.peak_bytes / 1e6:.1f} MB, were on disk for the trainer at once (window "
             f"{self.proxy.window_bytes / 1e6:g} MB)")
