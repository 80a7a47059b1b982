"""The ``draftgen`` command line: flags → config → one library call per command.

Every command catches ``DraftgenError`` and prints ``Error: <message>`` on one line (no traceback), then
exits with the error's exit code. Ctrl-C exits 130 with a one-line message. Nothing here holds logic.

One convention for every command: ``-v/--verbose`` before or after the subcommand; every command that talks
to an endpoint (generate, run, plan, probe) takes the same ``--base-url`` (default ``$DRAFTGEN_BASE_URL``) and
``--api-key-file``. Keys never travel on the command line: they come from a file or the environment,
``emulate``'s included (``--api-key-file`` or ``$DRAFTGEN_EMULATOR_API_KEY``).

The commands are here; how they fail, read their flags and refuse a key on the command line is
``cli.flags``'s. ``python -m draftgen.cli`` runs ``main`` (``cli/__main__.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from draftgen import __version__
from draftgen.cli.flags import (
    BASE_URL_ENV,
    EMULATOR_API_KEY_ENV,
    EMULATOR_MANAGEMENT_KEY_ENV,
    TokenCount,
    argv_key_problem,
    endpoint_options,
    endpoint_overrides,
    fail,
    force_option,
    friendly,
    from_cwd,
    generate_options,
    generate_overrides,
    load,
    run_dir_option,
    setup_logging,
    skip_bad_option,
    url_or_cwd,
    verbose_option,
)

__all__ = ["BASE_URL_ENV", "EMULATOR_API_KEY_ENV", "EMULATOR_MANAGEMENT_KEY_ENV", "TokenCount", "argv_key_problem",
           "cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="draftgen")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr (also accepted after the subcommand).")
def cli(verbose: bool) -> None:
    """Generate exact-token-ID training data for speculative-decoding drafters."""
    setup_logging(verbose)



@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@generate_options
@click.option("--redo", multiple=True, type=click.Choice(["changed", "truncated"]),
              help="Generate again the samples whose records were made with other settings (changed) or cut at a "
                   "max_tokens below today's (truncated); repeatable. A rerun without it keeps them and says so.")
@click.option("--round", "round_", type=click.IntRange(min=2), metavar="N",
              help="Start round N as `plan --next-round` proposed it (rounds/round-N.json), then generate its prompts.")
@friendly
def generate(config: str, redo: tuple[str, ...], round_: int | None, **kw: Any) -> None:
    """Send prepared prompts and write raw responses with exact token ids (resumable)."""
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare

    cfg = load(config, generate_overrides(kw))
    report = run_generate(cfg, echo=click.echo, force=kw["force"], datasets=list(kw["datasets"]),
                          partition=kw["partition"], argv=sys.argv, base_url_flag=kw.get("base_url"), redo=redo,
                          prepare=run_prepare, round=round_)  # datasets not prepared yet are prepared first
    if report.exit_code:
        sys.exit(report.exit_code)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@skip_bad_option
@force_option
@friendly
def prepare(config: str, run_dir: str | None, skip_bad: bool, force: bool) -> None:
    """Normalise prompt datasets into prepared/<dataset>/prompts.jsonl."""
    from draftgen.phases.prepare.run import run_prepare

    cfg = load(config, {"run_dir": run_dir, "prepare.skip_bad": True if skip_bad else None})
    run_prepare(cfg, echo=click.echo, force=force)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--reference", type=click.Path(dir_okay=False), help="Reference ids (emulator ground truth or exact-id records).")
@force_option
@friendly
def audit(config: str, run_dir: str | None, reference: str | None, force: bool) -> None:
    """Check reconstructed ids: structure, billing agreement, BPE drift against reference ids."""
    from draftgen.phases.audit.run import run_audit

    cfg = load(config, {"run_dir": run_dir, "audit.reference": str(Path(reference).resolve()) if reference else None})
    run_audit(cfg, echo=click.echo, force=force)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@force_option
@friendly
def merge(config: str, run_dir: str | None, force: bool) -> None:
    """Filter, dedupe, cap, shuffle and split into merged/ Parquet plus exports."""
    from draftgen.phases.merge.run import run_merge

    cfg = load(config, {"run_dir": run_dir})
    run_merge(cfg, echo=click.echo, force=force)



@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--output", callback=url_or_cwd, help="Destination folder or fsspec URL, e.g. s3://bucket/prefix (overrides hidden_states.output).")
@click.option("--model", callback=url_or_cwd, help="Target model folder or hub id (overrides hidden_states.model).")
@click.option("--backend", help="Capture backend (overrides hidden_states.backend): hf, vllm.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", "fp8"]), help="Storage dtype (overrides hidden_states.dtype).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Where the target runs (overrides hidden_states.device).")
@click.option("--limit", type=int, help="Stop after this many new samples (the manifest then says complete: false).")
@click.option("--pilot", type=int, help="Extract this many samples to measure throughput for plan (they are kept).")
@click.option("--workers", type=click.IntRange(min=1), help="Run on a Ray Data actor pool of this many actors (sets hidden_states.ray and .workers).")
@force_option
@friendly
def extract(config: str, run_dir: str | None, output: str | None, model: str | None, backend: str | None,
            dtype: str | None, device: str | None, limit: int | None, pilot: int | None, workers: int | None,
            force: bool) -> None:
    """Capture the target's hidden states for every merged train row into hidden/ (resumable; checked)."""
    from draftgen.phases.extract.run import run_extract

    cfg = load(config, {"run_dir": run_dir, "hidden_states.output": output, "hidden_states.model": model,
                         "hidden_states.backend": backend, "hidden_states.dtype": dtype, "hidden_states.device": device,
                         "hidden_states.ray": True if workers else None, "hidden_states.workers": workers})
    run_extract(cfg, echo=click.echo, limit=limit, pilot=pilot, force=force)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--hidden", callback=url_or_cwd, help="The hidden set to train on (overrides train.hidden).")
@click.option("--verifier", callback=from_cwd, help="The target model's local folder (overrides train.verifier).")
@click.option("--speculators", "speculators_bin", callback=from_cwd,
              help="speculators' executable or its environment's python (overrides train.speculators).")
@click.option("--epochs", type=int, help="Training epochs (overrides train.epochs); a rerun with more resumes.")
@click.option("--max-steps", type=int, help="Stop after this many steps in all (overrides train.max_steps).")
@click.option("--draft-vocab-size", type=int, help="Draft vocabulary size (overrides train.draft_vocab_size).")
@click.option("--algorithm", help="The drafter to train (overrides train.algorithm): eagle3, eagle3.1, peagle, "
              "dflash, dflash2, dspark, xpress.")
@click.option("--online", is_flag=True, help="Hidden states generated on demand by the vLLM extract servers "
              "(hidden_states.base_urls), checked on the way, never stored (train.online).")
@click.option("--nproc-per-node", type=int, help="Trainer processes on this node, through torchrun "
              "(overrides train.nproc_per_node).")
@click.option("--restart", is_flag=True, help="Drop earlier checkpoints and train from scratch.")
@click.option("--draft-lm", is_flag=True, help="Instead: train the baseline draft LM (ids only, the trained drafter's "
              "size, steps and tokens) into train/draft-lm/, for accept --draft-lm.")
@click.option("--allow-partial", is_flag=True,
              help="Train on an incomplete hidden set (extract --limit/--pilot) instead of refusing it.")
@force_option
@friendly
def train(config: str, run_dir: str | None, hidden: str | None, verifier: str | None, speculators_bin: str | None,
          epochs: int | None, max_steps: int | None, draft_vocab_size: int | None, algorithm: str | None,
          online: bool, nproc_per_node: int | None, restart: bool, draft_lm: bool, allow_partial: bool,
          force: bool) -> None:
    """Train a drafter with speculators on hidden/, or online from the vLLM extract servers (resumes; writes a
    vLLM checkpoint, and an SGLang one for the EAGLE-3 family)."""
    from draftgen.phases.train.run import run_train

    cfg = load(config, {"run_dir": run_dir, "train.hidden": hidden, "train.verifier": verifier,
                         "train.speculators": speculators_bin, "train.epochs": epochs, "train.max_steps": max_steps,
                         "train.draft_vocab_size": draft_vocab_size, "train.algorithm": algorithm,
                         "train.online": True if online else None, "train.nproc_per_node": nproc_per_node,
                         "train.allow_partial": True if allow_partial else None})
    if draft_lm:
        from draftgen.phases.train.draftlm import run_draft_lm

        run_draft_lm(cfg, echo=click.echo, force=force)
    else:
        run_train(cfg, echo=click.echo, restart=restart, force=force)


@cli.command(name="export-hidden")
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--format", "formats", multiple=True, required=True,
              type=click.Choice(["speculators", "specforge", "modelopt"]),
              help="Trainer format (repeatable): speculators, specforge, modelopt.")
@click.option("--out", callback=from_cwd, help="Output folder (default <run>/hidden-exports/<format>).")
@click.option("--hidden", callback=url_or_cwd, help="The hidden set (default hidden_states.output or <run>/hidden).")
@click.option("--target", callback=from_cwd, help="Target model folder, for the post-norm final state "
              "(default hidden_states.model).")
@click.option("--include-flagged", is_flag=True, help="Also export samples that failed an extract check.")
@friendly
def export_hidden(config: str, run_dir: str | None, formats: tuple[str, ...], out: str | None, hidden: str | None,
                  target: str | None, include_flagged: bool) -> None:
    """Write hidden/ in a peer trainer's offline format, in extraction order (sample_ids.jsonl maps it)."""
    from draftgen.hidden import exports

    cfg = load(config, {"run_dir": run_dir})
    exports.export_hidden(cfg, list(formats), out, hidden=hidden, target_dir=target, include_flagged=include_flagged,
                          echo=click.echo)

@cli.command(name="import")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--dataset", required=True, help="The dataset the records belong to.")
@run_dir_option
@force_option
@friendly
def import_(config: str, file: str, dataset: str, run_dir: str | None, force: bool) -> None:
    """Check and add records made elsewhere (local SGLang {sample_id, output_ids} rows, another run's raw log)."""
    from draftgen.phases.importer.run import run_import

    cfg = load(config, {"run_dir": run_dir})
    run_import(cfg, echo=click.echo, force=force, dataset=dataset, source=Path(file))


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@endpoint_options
@click.option("--prompt", help="Prompt to send (overrides probe.prompt).")
@friendly
def probe(config: str, api_key_file: str | None, base_url: str | None, prompt: str | None) -> None:
    """One request that checks key, credits, provider, reasoning field, cost and reconstruction."""
    from draftgen.phases.probe.run import run_probe

    cfg = load(config, {**endpoint_overrides(api_key_file, base_url), "probe.prompt": prompt})
    report = run_probe(cfg, echo=click.echo)
    if not report.ok:
        sys.exit(1)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@endpoint_options
@click.option("--drafter", required=True, type=click.Path(file_okay=False),
              help="The drafter checkpoint folder the server serves (speculators or EAGLE format).")
@click.option("--baseline-url", help="A server of the same target without the drafter (tokens/s without it).")
@click.option("--zero-aux-url", help="A server of the same target and drafter fed zeroed aux states "
              "(draftgen emulate --zero-aux): the zero-aux ablation.")
@click.option("--prompts", type=int, help="Held-out prompts to send (overrides accept.prompts).")
@click.option("--draft-lm", callback=from_cwd, help="A draft LM folder (train --draft-lm) to replay beside copy-last "
              "and lookup (overrides accept.draft_lm).")
@friendly
def accept(config: str, run_dir: str | None, api_key_file: str | None, base_url: str | None, drafter: str,
           baseline_url: str | None, zero_aux_url: str | None, prompts: int | None, draft_lm: str | None) -> None:
    """Measure the served drafter's acceptance length on held-out prompts (vLLM /metrics or SGLang meta_info),
    beside copy-last and n-gram lookup on the same prompts, with 95% intervals and per dataset."""
    from draftgen.phases.accept.run import run_accept

    cfg = load(config, {"run_dir": run_dir, **endpoint_overrides(api_key_file, base_url)})
    run_accept(cfg, echo=click.echo, drafter=drafter, baseline_url=baseline_url, zero_aux_url=zero_aux_url,
               prompts=prompts, draft_lm=draft_lm)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@endpoint_options
@click.option("--pilot", type=int, help="Prompts per dataset to send as a pilot (overrides plan.pilot).")
@click.option("--next-round", is_flag=True, help="Propose the next round of generation from the run's measured "
              "acceptance (accept/acceptance.json) and write rounds/round-N.json; `generate --round N` starts it.")
@click.option("--spread", type=click.Choice(["guided", "uniform"]), default="guided", show_default=True,
              help="With --next-round: where the model expects the most acceptance per unit spent, or evenly.")
@click.option("--add-usd", type=float, help="With --next-round: the round's budget in USD (default: what round 1 cost).")
@click.option("--add-tokens", type=TokenCount(), help="With --next-round: the round's budget in supervised tokens.")
@click.option("--acceptance", type=click.Path(dir_okay=False, exists=True),
              help="With --next-round: the accept pass to steer by (default: accept/acceptance.json).")
@force_option
@skip_bad_option
@friendly
def plan(config: str, run_dir: str | None, api_key_file: str | None, base_url: str | None, pilot: int | None,
         next_round: bool, spread: str, add_usd: float | None, add_tokens: int | None, acceptance: str | None,
         force: bool, skip_bad: bool) -> None:
    """Estimate tokens, dollars, time and hidden-state disk before spending; or propose the next round."""
    from draftgen.phases.plan.rounds import run_next_round
    from draftgen.phases.plan.run import run_plan

    cfg = load(config, {"run_dir": run_dir, **endpoint_overrides(api_key_file, base_url), "plan.pilot": pilot,
                         "prepare.skip_bad": True if skip_bad else None})
    if next_round:
        run_next_round(cfg, spread=spread, add_usd=add_usd, add_tokens=add_tokens, echo=click.echo, force=force,
                       acceptance=Path(acceptance) if acceptance else None)
    else:
        run_plan(cfg, echo=click.echo, force=force)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@generate_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask before spending more than plan.confirm_above_usd.")
@click.option("--dry-run", is_flag=True, help="Prepare, print the plan, and stop (exit 0; nothing is sent).")
@friendly
def run(config: str, yes: bool, dry_run: bool, **kw: Any) -> None:
    """Prepare → generate → audit → merge → report, resuming where it stopped.

    With hidden_states.extract, train.enabled and accept.enabled the run goes on through extract → train →
    accept before the report (the phase table, docs/train.md "In draftgen run"). The plan (tokens, dollars, time) is printed before generating. When its expected cost is over
    plan.confirm_above_usd (default $1; never for the emulator or self-hosted servers) it asks first on a
    terminal; a no exits 1 with nothing sent. Without a terminal it refuses (exit 2) unless --yes.
    """
    from draftgen.phases.pipeline import run_pipeline

    cfg = load(config, generate_overrides(kw))
    ask = (lambda question: click.confirm(question, default=False)) if sys.stdin.isatty() else None
    report = run_pipeline(cfg, argv=sys.argv, datasets=list(kw["datasets"]), partition=kw["partition"],
                          base_url_flag=kw.get("base_url"), force=kw["force"], echo=click.echo,
                          yes=yes, dry_run=dry_run, confirm=ask)
    if report.exit_code:
        sys.exit(report.exit_code)


#: ``status --watch``'s refresh interval when none is given
WATCH_DEFAULT_S = 2.0


@cli.command()
@click.argument("target", type=click.Path(), required=False)
@click.option("--watch", is_flag=False, flag_value=str(WATCH_DEFAULT_S), default=None, metavar="[SECONDS]",
              help=f"Refresh every SECONDS (default {WATCH_DEFAULT_S:g}) until Ctrl-C; before or after TARGET.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary (one JSON object).")
@friendly
def status(target: str | None, watch: str | None, as_json: bool) -> None:
    """Summarise a run directory (or a config's run directory), during a run or after it."""
    from draftgen.phases.status.run import status_command

    target, interval = _watch_args(target, watch)
    status_command(target, watch=interval, as_json=as_json, echo=click.echo)


def _watch_args(target: str | None, watch: str | None) -> tuple[str, float | None]:
    """TARGET and the refresh interval of ``status``: ``--watch`` takes an optional number, so in
    ``status --watch CONFIG`` the word after it is the target, not an interval."""
    interval: float | None = None
    if watch is not None:
        try:
            interval = float(watch)
        except ValueError:
            if target is not None:
                raise click.BadParameter(f"{watch!r} is not a number of seconds", param_hint="--watch") from None
            target, interval = watch, WATCH_DEFAULT_S
        if not interval > 0:
            raise click.BadParameter(f"{watch!r}: the interval must be over 0 seconds", param_hint="--watch")
    if target is None:
        raise click.UsageError("Missing argument 'TARGET' (a run directory or a config file).")
    return target, interval


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--output", type=click.Path(dir_okay=False), help="Where to write the page (default <run_dir>/report.html).")
@force_option
@friendly
def report(config: str, run_dir: str | None, output: str | None, force: bool) -> None:
    """Write report.html: one self-contained page with tables and charts."""
    from draftgen.phases.report.run import run_report

    cfg = load(config, {"run_dir": run_dir})
    run_report(cfg, echo=click.echo, force=force, output=Path(output) if output else None)  # echoes "report: PATH"


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--scenario", default="fast", show_default=True, help="fast | realistic | chaos | path to a scenario YAML.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--ground-truth", type=click.Path(dir_okay=False), help="Append {generation_id, output_ids, prompt_ids} per response.")
@click.option("--api-key-file", type=click.Path(dir_okay=False),
              help=f"File holding only the key to accept (default: ${EMULATOR_API_KEY_ENV}; neither: any sk-or-… key).")
@click.option("--management-key-file", type=click.Path(dir_okay=False),
              help=f"File holding only the key that may read /credits (default: ${EMULATOR_MANAGEMENT_KEY_ENV}).")
@click.option("--credits", type=float, default=100.0, show_default=True, help="Starting credits in USD.")
@click.option("--profile", default="qwen3", show_default=True, help="Token profile of the emulated model.")
@click.option("--tokenizer", default="bundled:qwen3", show_default=True, help="Tokenizer of the emulated model.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False),
              help="Serve this transformers model folder instead (vLLM-compatible, real generation on CPU).")
@click.option("--served-model-name", help="With --model: the model id served (default: the folder's name).")
@click.option("--extract-dir", type=click.Path(file_okay=False),
              help="With --model: extract mode; hidden-state files as vLLM's connector (its shared_storage_path).")
@click.option("--extract-layers", help="With --extract-dir: vLLM-convention layer ids, e.g. 2,4,5,8 (default [2, L//2, L-3, L]).")
@click.option("--extract-fault", help="With --extract-dir: misbehave on purpose (tests): prompt_ids, layers_off_by_one, "
              "final_wrong_layer, final_post_norm, aux_zeros, shift or nan_every_N.")
@click.option("--drafter", type=click.Path(file_okay=False), help="With --model: an EAGLE-3 drafter checkpoint for speculative decoding.")
@click.option("--num-speculative-tokens", type=int, default=3, show_default=True, help="With --drafter: tokens per draft.")
@click.option("--zero-aux", is_flag=True,
              help="With --drafter: feed it zeroed aux states (the zero-aux ablation; accept --zero-aux-url).")
@click.option("--per-request-spec-decode-metrics", type=click.Choice(["summary", "detailed"]),
              help="With --drafter: each response's metrics.speculative_decoding, as vLLM's flag of that name.")
@click.option("--device", default="cpu", show_default=True, help="With --model: torch device.")
@click.option("--dtype", default="auto", show_default=True, help="With --model: auto | float32 | bfloat16 | float16.")
@click.option("--provider", "provider_name",
              help="With --model: the provider named in each chat completion (top-level provider, as OpenRouter).")
@click.option("--perturb", type=float, default=0.0, show_default=True,
              help="With --model: seeded Gaussian noise of this relative scale on every weight (a 'quantized' copy).")
@click.option("--perturb-seed", type=int, default=0, show_default=True, help="With --perturb: the noise's seed.")
@friendly
def emulate(api_key_file: str | None, management_key_file: str | None, model_dir: str | None,
            served_model_name: str | None, extract_dir: str | None, extract_layers: str | None,
            extract_fault: str | None, drafter: str | None, num_speculative_tokens: int, zero_aux: bool,
            per_request_spec_decode_metrics: str | None, device: str, dtype: str, provider_name: str | None,
            perturb: float, perturb_seed: int, **kw: Any) -> None:
    """Serve a local OpenRouter emulator (also SGLang /generate and vLLM token-id modes), or with --model a
    vLLM-compatible server backed by a real transformers model (extract mode, drafter counters)."""
    from draftgen.emulator.core import emulator_key
    from draftgen.emulator.server import EmulatorOptions, serve_forever

    if model_dir is not None:
        from draftgen.emulator.real.server import model_server_options
        from draftgen.emulator.real.server import serve_forever as serve_model

        serve_model(model_server_options(
            model_dir, host=kw["host"], port=kw["port"], served_model_name=served_model_name, extract_dir=extract_dir,
            extract_layers=extract_layers, extract_fault=extract_fault, drafter=drafter,
            num_speculative_tokens=num_speculative_tokens, zero_aux=zero_aux,
            per_request_spec_decode_metrics=per_request_spec_decode_metrics, device=device, dtype=dtype,
            provider=provider_name, perturb=perturb, perturb_seed=perturb_seed),
            echo=click.echo)
        return
    api_key = emulator_key(api_key_file, EMULATOR_API_KEY_ENV, flag="--api-key-file")
    management_key = emulator_key(management_key_file, EMULATOR_MANAGEMENT_KEY_ENV, flag="--management-key-file")
    serve_forever(EmulatorOptions(api_key=api_key, management_key=management_key, **kw), echo=click.echo)



# -v/--verbose after the subcommand as well as before it, on every command (keep this after the last command)
for _command in cli.commands.values():
    verbose_option(_command)


def main() -> None:
    problem = argv_key_problem(sys.argv[1:])
    if problem:
        fail(problem, 2)
    cli(prog_name="draftgen")
