"""The emulator embedded in a run: ``endpoint: emulator`` without a ``base_url``.

``embedded_emulator(cfg, ...)`` starts one emulator in a background thread for the duration of a
``with`` block, configured from the run config (scenario, seed, credits from ``endpoint.emulator``; the
target's profile and tokenizer from ``model``), writing ground truth to
``<run_dir>/emulator/ground_truth.jsonl`` when asked. It yields the API root, or None when the config
points at a server of its own; ``embedded_endpoint`` yields the same as the list of base URLs a backend takes
(None: the configured ones). generate, probe and plan all start it through here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from draftgen.config import RunConfig
from draftgen.rundir import RunDir

if TYPE_CHECKING:
    from draftgen.tokens import Profile

__all__ = ["BUILTIN_SCENARIOS", "embedded_emulator", "embedded_endpoint"]

BUILTIN_SCENARIOS = ("fast", "realistic", "chaos")


@contextlib.contextmanager
def embedded_emulator(
    cfg: RunConfig,
    *,
    api_key: str | None = None,
    management_key: str | None = None,
    ground_truth: bool = True,
    profile: Profile | None = None,
) -> Iterator[str | None]:
    """``profile``: the command's already loaded profile of ``cfg.model`` (default: loaded here, if the
    emulator starts)."""
    from draftgen.backends import capabilities

    ep = cfg.endpoint
    if not capabilities(ep.kind).embedded_server or ep.base_url or ep.base_urls:
        yield None
        return
    from draftgen.emulator.server import EmulatorOptions, start_in_thread

    em = ep.emulator
    scenario = em.scenario if em.scenario in BUILTIN_SCENARIOS else str(cfg.path(em.scenario))
    tokenizer = cfg.model.tokenizer
    if not tokenizer.startswith(("bundled:", "hf:")):
        tokenizer = str(cfg.path(tokenizer))
    gt = None
    if ground_truth and em.ground_truth:
        gt_path = RunDir(cfg.run_path).ground_truth
        gt_path.parent.mkdir(parents=True, exist_ok=True)
        gt = str(gt_path)
    if profile is None:
        from draftgen.tokens import profile_from_config

        profile = profile_from_config(cfg)

    opts = EmulatorOptions(
        host="127.0.0.1", port=0, scenario=scenario, seed=em.seed, ground_truth=gt,
        api_key=api_key, management_key=management_key, credits=em.credits,
        profile=cfg.model.profile, tokenizer=tokenizer, thinking=cfg.model.thinking,
        # The same profile object as the run's, so custom templates and kwargs render identically.
        profile_obj=profile,
    )
    with start_in_thread(opts) as emu:
        yield emu.base_url


@contextlib.contextmanager
def embedded_endpoint(cfg: RunConfig, *, ground_truth: bool = False,
                      profile: Profile | None = None) -> Iterator[list[str] | None]:
    """Base URLs to use: the configured ones (None), or those of the embedded emulator for the block
    (``probe``, ``plan``: no ground truth unless asked). ``profile``: the command's already loaded profile,
    handed to the emulator (default: it loads one)."""
    with embedded_emulator(cfg, ground_truth=ground_truth, profile=profile) as url:
        yield [url] if url else None
