"""The ``draftgen`` command line: flags → config → one library call per command.

Every command catches ``DraftgenError`` and prints ``Error: <message>`` on one line (no traceback), then
exits with the error's exit code. Ctrl-C exits 130 with a one-line message. Nothing here holds logic.

One convention for every command: ``-v/--verbose`` before or after the subcommand; every command that talks
to an endpoint (generate, run, plan, probe) takes the same ``--base-url`` (default ``$DRAFTGEN_BASE_URL``) and
``--api-key-file``. Keys never travel on the command line: they come from a file or the environment,
``emulate``'s included (``--api-key-file`` or ``$DRAFTGEN_EMULATOR_API_KEY``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click

from draftgen import __version__
from draftgen.errors import DraftgenError

F = TypeVar("F", bound=Callable[..., Any])

#: where ``draftgen emulate`` reads the key it accepts, and the management key, when no file is given
EMULATOR_API_KEY_ENV = "DRAFTGEN_EMULATOR_API_KEY"
EMULATOR_MANAGEMENT_KEY_ENV = "DRAFTGEN_EMULATOR_MANAGEMENT_KEY"


def _fail(message: str, code: int) -> None:
    from draftgen.secrets import redact

    line = " ".join(redact(message).splitlines())  # one line, and never a key
    click.echo(f"Error: {line}", err=True)
    sys.exit(code)


def friendly(fn: F) -> F:
    """Turn library errors into one line and an exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DraftgenError as exc:
            _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted; completed work is on disk and the next run resumes from it", 130)
        except BrokenPipeError:
            sys.exit(1)
        except OSError as exc:  # a path the library did not anticipate (a file where a folder must be, ...)
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}; check that path and its permissions", 1)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # a bug: still one line (redacted), the traceback only with -v
            import logging

            log = logging.getLogger("draftgen")
            if log.isEnabledFor(logging.DEBUG):
                import traceback

                from draftgen.secrets import redact

                sys.stderr.write(redact(traceback.format_exc()))
            _fail(f"unexpected {type(exc).__name__}: {exc}; this is a bug in draftgen, please report it "
                  "(run with -v for the traceback)", 1)

    return wrapper  # type: ignore[return-value]


#: The flag that sets each config key it overrides: a value the config's checks refuse is blamed on it.
FLAG_OF: dict[str, str] = {
    "run_dir": "--run-dir", "budget.token_budget": "--token-budget", "budget.max_spend_usd": "--max-spend",
    "prepare.skip_bad": "--skip-bad", "partitions.short.concurrency": "--short-concurrency",
    "partitions.long.concurrency": "--long-concurrency", "partitions.short.max_tokens": "--short-max-tokens",
    "partitions.long.max_tokens": "--long-max-tokens", "endpoint.api_key_file": "--api-key-file",
    "endpoint.base_url": "--base-url", "audit.reference": "--reference", "hidden_states.output": "--output",
    "hidden_states.model": "--model", "hidden_states.backend": "--backend", "hidden_states.dtype": "--dtype",
    "hidden_states.device": "--device", "hidden_states.ray": "--workers", "hidden_states.workers": "--workers",
    "train.hidden": "--hidden", "train.verifier": "--verifier", "train.speculators": "--speculators",
    "train.epochs": "--epochs", "train.max_steps": "--max-steps", "train.draft_vocab_size": "--draft-vocab-size",
    "train.algorithm": "--algorithm", "train.online": "--online", "train.nproc_per_node": "--nproc-per-node",
    "train.allow_partial": "--allow-partial", "probe.prompt": "--prompt", "plan.pilot": "--pilot",
}


def _load(config: str, overrides: dict[str, Any] | None = None) -> Any:
    from draftgen.config import load_config
    from draftgen.extensions import check_config

    cfg = load_config(config, overrides, flags=FLAG_OF)
    check_config(cfg, config)
    return cfg


def _setup_logging(verbose: bool) -> None:
    """Log to stderr; ``verbose`` turns on debug logging. Idempotent: ``-v`` before the subcommand (the group)
    and after it (the command) set the same state, and once on it stays on."""
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose:
        logging.getLogger().setLevel(logging.DEBUG)


_VERBOSE_HELP = "Debug logging on stderr (also accepted before the subcommand)."


def _verbose_callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _setup_logging(True)


#: ``-v/--verbose`` after the subcommand; added to every command below (see the end of the module)
verbose_option = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_verbose_callback,
                              help=_VERBOSE_HELP)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="draftgen")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr (also accepted after the subcommand).")
def cli(verbose: bool) -> None:
    """Generate exact-token-ID training data for speculative-decoding drafters."""
    _setup_logging(verbose)


def _from_cwd(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A path typed on the command line is relative to the working directory (run_dir in a config file is
    relative to the file's folder); the absolute path goes into the config overrides."""
    return str(Path(value).resolve()) if value else value


#: the environment variable that gives ``--base-url`` when the flag is absent
BASE_URL_ENV = "DRAFTGEN_BASE_URL"


def endpoint_options(fn: F) -> F:
    """``--api-key-file`` and ``--base-url``, the same on every command that talks to an endpoint."""
    opts = [
        click.option("--api-key-file", type=click.Path(dir_okay=False),
                     help="File holding only the API key (default: the variable named by endpoint.api_key_env, "
                          "OPENROUTER_API_KEY). Keys are never passed on the command line."),
        click.option("--base-url", envvar=BASE_URL_ENV,
                     help=f"API root, e.g. https://openrouter.ai/api/v1 or http://127.0.0.1:PORT/api/v1 "
                          f"(default: ${BASE_URL_ENV}, else endpoint.base_url of the config)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def endpoint_overrides(api_key_file: str | None, base_url: str | None) -> dict[str, Any]:
    """Config overrides of the two endpoint options (a key file's path is made absolute here)."""
    return {
        "endpoint.api_key_file": str(Path(api_key_file).resolve()) if api_key_file else None,
        "endpoint.base_url": base_url or None,
    }


run_dir_option = click.option("--run-dir", type=click.Path(file_okay=False), callback=_from_cwd,
                              help="Run directory (overrides run_dir; relative to the working directory).")
force_option = click.option("--force", is_flag=True,
                            help="Accept records made by another model, profile or tokenizer (the outputs record it).")
skip_bad_option = click.option("--skip-bad", is_flag=True,
                               help="Skip and count malformed input lines instead of stopping (prepare.skip_bad).")


class TokenCount(click.ParamType):  # type: ignore[type-arg]
    """A token count: an integer, with an optional k / M / G suffix (``10M`` = 10,000,000; ``1.5k``)."""

    name = "TOKENS"
    _SCALE: ClassVar[dict[str, int]] = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().replace(",", "").replace("_", "")
        suffix = text[-1:].lower() if text[-1:].isalpha() else ""
        try:
            number = float(text[: len(text) - len(suffix)]) * self._SCALE[suffix]
        except (KeyError, ValueError):
            self.fail(f"{value!r} is not a token count; write e.g. 20000000, 20M or 500k", param, ctx)
        if number < 0 or number != int(number):
            self.fail(f"{value!r} is not a whole, non-negative token count", param, ctx)
        return int(number)



def generate_options(fn: F) -> F:
    opts = [
        click.option("--dataset", "datasets", multiple=True, help="Only this dataset (repeatable)."),
        click.option("--partition", type=click.Choice(["short", "long", "all"]), default="all", show_default=True),
        click.option("--token-budget", type=TokenCount(), help="Completion-token budget per dataset (10M, 500k, 20000000)."),
        click.option("--max-spend", type=float, help="Dollar budget for this run directory (USD)."),
        click.option("--short-concurrency", type=int, help="Requests in flight for the short partition."),
        click.option("--long-concurrency", type=int, help="Requests in flight for the long partition."),
        click.option("--short-max-tokens", type=int, help="max_tokens for short prompts."),
        click.option("--long-max-tokens", type=int, help="max_tokens for long prompts."),
        run_dir_option,
        force_option,
        skip_bad_option,
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return endpoint_options(fn)


def generate_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_dir": kw.get("run_dir"),
        "budget.token_budget": kw.get("token_budget"),
        "prepare.skip_bad": True if kw.get("skip_bad") else None,
        "budget.max_spend_usd": kw.get("max_spend"),
        "partitions.short.concurrency": kw.get("short_concurrency"),
        "partitions.long.concurrency": kw.get("long_concurrency"),
        "partitions.short.max_tokens": kw.get("short_max_tokens"),
        "partitions.long.max_tokens": kw.get("long_max_tokens"),
        **endpoint_overrides(kw.get("api_key_file"), kw.get("base_url")),
    }
    return out


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

    cfg = _load(config, generate_overrides(kw))
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

    cfg = _load(config, {"run_dir": run_dir, "prepare.skip_bad": True if skip_bad else None})
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

    cfg = _load(config, {"run_dir": run_dir, "audit.reference": str(Path(reference).resolve()) if reference else None})
    run_audit(cfg, echo=click.echo, force=force)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@force_option
@friendly
def merge(config: str, run_dir: str | None, force: bool) -> None:
    """Filter, dedupe, cap, shuffle and split into merged/ Parquet plus exports."""
    from draftgen.phases.merge.run import run_merge

    cfg = _load(config, {"run_dir": run_dir})
    run_merge(cfg, echo=click.echo, force=force)


def _url_or_cwd(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A URL (or, for --model, a hub id that is no local path) as it is; a local path from the working directory."""
    if not value or "://" in value or (param.name == "model" and not Path(value).exists()):
        return value
    return _from_cwd(ctx, param, value)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--output", callback=_url_or_cwd, help="Destination folder or fsspec URL, e.g. s3://bucket/prefix (overrides hidden_states.output).")
@click.option("--model", callback=_url_or_cwd, help="Target model folder or hub id (overrides hidden_states.model).")
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

    cfg = _load(config, {"run_dir": run_dir, "hidden_states.output": output, "hidden_states.model": model,
                         "hidden_states.backend": backend, "hidden_states.dtype": dtype, "hidden_states.device": device,
                         "hidden_states.ray": True if workers else None, "hidden_states.workers": workers})
    run_extract(cfg, echo=click.echo, limit=limit, pilot=pilot, force=force)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@run_dir_option
@click.option("--hidden", callback=_url_or_cwd, help="The hidden set to train on (overrides train.hidden).")
@click.option("--verifier", callback=_from_cwd, help="The target model's local folder (overrides train.verifier).")
@click.option("--speculators", "speculators_bin", callback=_from_cwd,
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

    cfg = _load(config, {"run_dir": run_dir, "train.hidden": hidden, "train.verifier": verifier,
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
@click.option("--out", callback=_from_cwd, help="Output folder (default <run>/hidden-exports/<format>).")
@click.option("--hidden", callback=_url_or_cwd, help="The hidden set (default hidden_states.output or <run>/hidden).")
@click.option("--target", callback=_from_cwd, help="Target model folder, for the post-norm final state "
              "(default hidden_states.model).")
@click.option("--include-flagged", is_flag=True, help="Also export samples that failed an extract check.")
@friendly
def export_hidden(config: str, run_dir: str | None, formats: tuple[str, ...], out: str | None, hidden: str | None,
                  target: str | None, include_flagged: bool) -> None:
    """Write hidden/ in a peer trainer's offline format, in extraction order (sample_ids.jsonl maps it)."""
    from draftgen.hidden import exports

    cfg = _load(config, {"run_dir": run_dir})
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

    cfg = _load(config, {"run_dir": run_dir})
    run_import(cfg, echo=click.echo, force=force, dataset=dataset, source=Path(file))


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@endpoint_options
@click.option("--prompt", help="Prompt to send (overrides probe.prompt).")
@friendly
def probe(config: str, api_key_file: str | None, base_url: str | None, prompt: str | None) -> None:
    """One request that checks key, credits, provider, reasoning field, cost and reconstruction."""
    from draftgen.phases.probe.run import run_probe

    cfg = _load(config, {**endpoint_overrides(api_key_file, base_url), "probe.prompt": prompt})
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
@click.option("--draft-lm", callback=_from_cwd, help="A draft LM folder (train --draft-lm) to replay beside copy-last "
              "and lookup (overrides accept.draft_lm).")
@friendly
def accept(config: str, run_dir: str | None, api_key_file: str | None, base_url: str | None, drafter: str,
           baseline_url: str | None, zero_aux_url: str | None, prompts: int | None, draft_lm: str | None) -> None:
    """Measure the served drafter's acceptance length on held-out prompts (vLLM /metrics or SGLang meta_info),
    beside copy-last and n-gram lookup on the same prompts, with 95% intervals and per dataset."""
    from draftgen.phases.accept.run import run_accept

    cfg = _load(config, {"run_dir": run_dir, **endpoint_overrides(api_key_file, base_url)})
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

    cfg = _load(config, {"run_dir": run_dir, **endpoint_overrides(api_key_file, base_url), "plan.pilot": pilot,
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

    cfg = _load(config, generate_overrides(kw))
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

    cfg = _load(config, {"run_dir": run_dir})
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


#: flags that would carry a key on the command line (no command has one)
_KEY_FLAGS = ("--api-key", "--api_key", "--apikey", "--key", "--openrouter-api-key", "--openrouter-key",
              "--management-key", "--token")
_NO_KEY_ON_ARGV = ("keys are never passed on the command line; set OPENROUTER_API_KEY (or the variable named "
                   "by endpoint.api_key_env) to the key, or pass --api-key-file PATH (a file holding only the key)")
_NO_KEY_ON_EMULATE = (f"keys are never passed on the command line; set {EMULATOR_API_KEY_ENV} (the key to accept) "
                      f"or {EMULATOR_MANAGEMENT_KEY_ENV} (the key that may read /credits), or pass --api-key-file "
                      "PATH / --management-key-file PATH (a file holding only the key)")


def _argv_key_problem(args: list[str]) -> str | None:
    """Why ``args`` must be refused before click parses them (a key on the command line), or None.
    Never includes the key. ``emulate`` too reads its keys from files or the environment only."""
    from draftgen.secrets import contains_key, looks_like_key

    command = next((a for a in args if not a.startswith("-")), None)
    how = _NO_KEY_ON_EMULATE if command == "emulate" else _NO_KEY_ON_ARGV
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in _KEY_FLAGS:
            return f"{flag} is not an option: {how}"
        if flag in ("--api-key-file", "--management-key-file"):
            path = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            parts = [path, *Path(path).parts] if path else []
            if any(looks_like_key(p) or contains_key(p) for p in parts) and not Path(path).is_file():
                env = EMULATOR_API_KEY_ENV if command == "emulate" else "OPENROUTER_API_KEY"
                return (f"{flag} takes the PATH of a file holding only the key, and its value looks like "
                        f"the key itself; write the key to a file and pass that file's path, or set "
                        f"{env} to the key")
        if flag == "--base-url" or (i > 0 and args[i - 1] == "--base-url"):
            continue  # config validation names what in the URL is a credential
        if looks_like_key(arg) or contains_key(arg):
            return f"an argument looks like an API key; {how}"
    return None


# -v/--verbose after the subcommand as well as before it, on every command (keep this after the last command)
for _command in cli.commands.values():
    verbose_option(_command)


def main() -> None:
    problem = _argv_key_problem(sys.argv[1:])
    if problem:
        _fail(problem, 2)
    cli(prog_name="draftgen")


if __name__ == "__main__":
    main()
