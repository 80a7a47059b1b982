"""A faithful local OpenRouter emulator (plus SGLang ``/generate`` and vLLM token-id modes).

Run it with ``draftgen emulate`` or embed it::

    from draftgen.emulator import EmulatorOptions, start_in_thread, builtin_scenario

    sc = builtin_scenario("fast").with_provider("chutes", faults={"rate_limit": 0.5}, retry_after_s=0.05)
    with start_in_thread(EmulatorOptions(scenario_obj=sc, credits=1.0, ground_truth="gt.jsonl")) as emu:
        ...  # POST f"{emu.base_url}/chat/completions"; inspect emu.state

Modules: ``server`` (routes, lifecycle), ``core`` (options, auth, prompt cache, fault draws),
``openrouter`` (chat completions), ``responses`` (wire shapes, quirks), ``metadata`` (/key, /credits,
/generation, /models, /endpoints), ``routing``, ``accounting``, ``envelopes`` (error shapes), ``model``
(deterministic outputs through a token profile), ``textgen``, ``scenarios``, ``local_servers``.
"""

from __future__ import annotations

from .accounting import EmulatorState
from .core import EmulatorOptions
from .scenarios import FAULT_KINDS, ModelInfo, Provider, Scenario, builtin_scenario, load_scenario
from .server import RunningEmulator, serve_forever, start_in_thread

__all__ = [
    "FAULT_KINDS",
    "EmulatorOptions",
    "EmulatorState",
    "ModelInfo",
    "Provider",
    "RunningEmulator",
    "Scenario",
    "builtin_scenario",
    "load_scenario",
    "serve_forever",
    "start_in_thread",
]
