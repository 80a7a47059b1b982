"""The emulator embedded in a run: ``endpoint: emulator`` without a ``base_url``.

``embedded_emulator(cfg, ...)`` starts one emulator in a background thread for the duration of a
``with`` block, configured from the run config (scenario, seed, credits from ``endpoint.emulator``; the
target's profile and tokenizer from ``model``), writing ground truth to
``<run_dir>/emulator/ground_truth.jsonl`` when asked. It yields the API root, or None when the config
points at a server of its own. generate, probe and plan all start it through here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..config import RunConfig

__all__ = ["BUILTIN_SCENARIOS", "embedded_emulator", "ground_truth_path"]

BUILTIN_SCENARIOS = ("fast", "realistic", "chaos")


def ground_truth_path(cfg: RunConfig) -> str:
    return str(cfg.run_path / "emulator" / "ground_truth.jsonl")


@contextlib.contextmanager
def embedded_emulator(
    cfg: RunConfig,
    *,
    api_key: str | None = None,
    management_key: str | None = None,
    ground_truth: bool = True,
) -> Iterator[str | None]:
    ep = cfg.endpoint
    if ep.kind != "emulator" or ep.base_url or ep.base_urls:
        yield None
        return
    from .server import EmulatorOptions, start_in_thread

    em = ep.emulator
    scenario = em.scenario if em.scenario in BUILTIN_SCENARIOS else str(cfg.path(em.scenario))
    tokenizer = cfg.model.tokenizer
    if not tokenizer.startswith(("bundled:", "hf:")):
        tokenizer = str(cfg.path(tokenizer))
    gt = None
    if ground_truth and em.ground_truth:
        gt = ground_truth_path(cfg)
        cfg.run_path.joinpath("emulator").mkdir(parents=True, exist_ok=True)
    from ..tokens import profile_from_config

    opts = EmulatorOptions(
        host="127.0.0.1", port=0, scenario=scenario, seed=em.seed, ground_truth=gt,
        api_key=api_key, management_key=management_key, credits=em.credits,
        profile=cfg.model.profile, tokenizer=tokenizer, thinking=cfg.model.thinking,
        # The same profile object as the run's, so custom templates and kwargs render identically.
        profile_obj=profile_from_config(cfg),
    )
    with start_in_thread(opts) as emu:
        yield emu.base_url
