"""The command line's shared parts: how a command fails (one line, an exit code, never a key), how its flags
become config overrides (``FLAG_OF``: the flag a refused value is blamed on; ``load``), the options several
commands take (endpoint, run directory, force, skip-bad, generate's), token counts (``TokenCount``), and the
refusal of a key typed on the command line (``argv_key_problem``). ``draftgen.cli`` holds the commands.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click

from draftgen.errors import DraftgenError

F = TypeVar("F", bound=Callable[..., Any])

#: where ``draftgen emulate`` reads the key it accepts, and the management key, when no file is given
EMULATOR_API_KEY_ENV = "DRAFTGEN_EMULATOR_API_KEY"
EMULATOR_MANAGEMENT_KEY_ENV = "DRAFTGEN_EMULATOR_MANAGEMENT_KEY"


def fail(message: str, code: int) -> None:
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
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted; completed work is on disk and the next run resumes from it", 130)
        except BrokenPipeError:
            sys.exit(1)
        except OSError as exc:  # a path the library did not anticipate (a file where a folder must be, ...)
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}; check that path and its permissions", 1)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # a bug: still one line (redacted), the traceback only with -v
            import logging

            log = logging.getLogger("draftgen")
            if log.isEnabledFor(logging.DEBUG):
                import traceback

                from draftgen.secrets import redact

                sys.stderr.write(redact(traceback.format_exc()))
            fail(f"unexpected {type(exc).__name__}: {exc}; this is a bug in draftgen, please report it "
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


def load(config: str, overrides: dict[str, Any] | None = None) -> Any:
    from draftgen.config import load_config
    from draftgen.extensions import check_config

    cfg = load_config(config, overrides, flags=FLAG_OF)
    check_config(cfg, config)
    return cfg


def setup_logging(verbose: bool) -> None:
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
        setup_logging(True)


#: ``-v/--verbose`` after the subcommand; added to every command below (see the end of the module)
verbose_option = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_verbose_callback,
                              help=_VERBOSE_HELP)


def from_cwd(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
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


run_dir_option = click.option("--run-dir", type=click.Path(file_okay=False), callback=from_cwd,
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


def url_or_cwd(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A URL (or, for --model, a hub id that is no local path) as it is; a local path from the working directory."""
    if not value or "://" in value or (param.name == "model" and not Path(value).exists()):
        return value
    return from_cwd(ctx, param, value)


#: flags that would carry a key on the command line (no command has one)
_KEY_FLAGS = ("--api-key", "--api_key", "--apikey", "--key", "--openrouter-api-key", "--openrouter-key",
              "--management-key", "--token")
_NO_KEY_ON_ARGV = ("keys are never passed on the command line; set OPENROUTER_API_KEY (or the variable named "
                   "by endpoint.api_key_env) to the key, or pass --api-key-file PATH (a file holding only the key)")
_NO_KEY_ON_EMULATE = (f"keys are never passed on the command line; set {EMULATOR_API_KEY_ENV} (the key to accept) "
                      f"or {EMULATOR_MANAGEMENT_KEY_ENV} (the key that may read /credits), or pass --api-key-file "
                      "PATH / --management-key-file PATH (a file holding only the key)")


def argv_key_problem(args: list[str]) -> str | None:
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
