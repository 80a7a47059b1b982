"""A faithful local OpenRouter emulator (plus SGLang ``/generate`` and vLLM token-id modes).

Run it with ``draftgen emulate`` or embed it::

    from draftgen.emulator import EmulatorOptions, start_in_thread, builtin_scenario

    sc = builtin_scenario("fast").with_provider("chutes", faults={"rate_limit": 0.5}, retry_after_s=0.05)
    with start_in_thread(EmulatorOptions(scenario_obj=sc, credits=1.0, ground_truth="gt.jsonl")) as emu:
        ...  # POST f"{emu.base_url}/chat/completions"; inspect emu.state

Modules: ``server`` (routes, lifecycle; served on ``backends.serve``, in a thread or the foreground, as
``real.server`` is), ``core`` (options, auth, prompt cache, fault draws), ``openrouter`` (chat
completions), ``responses`` (wire shapes, quirks), ``metadata`` (/key, /credits, /generation, /models,
/endpoints), ``routing``, ``accounting``, ``envelopes`` (error shapes), ``scripted`` (deterministic
outputs through a token profile), ``textgen``, ``scenarios``, ``local_servers``, ``local_wire`` (the
SGLang/vLLM request parsing and error bodies shared with ``real.server``), ``real`` (``emulate --model``).

The names below are loaded on first use (PEP 562), so importing ``draftgen.emulator`` (or a phase that
may start it, such as ``generate``) loads neither the server modules nor ``aiohttp.web``.
``tests/test_imports.py`` holds that line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftgen.emulator.accounting import EmulatorState
    from draftgen.emulator.core import EmulatorOptions
    from draftgen.emulator.scenarios import (
        FAULT_KINDS,
        ModelInfo,
        Provider,
        Scenario,
        builtin_scenario,
        load_scenario,
    )
    from draftgen.emulator.server import RunningEmulator, serve_forever, start_in_thread

# Each public name and the submodule that defines it; every name in __all__ is here and vice versa.
_HOME = {
    "EmulatorState": "accounting",
    "EmulatorOptions": "core",
    "FAULT_KINDS": "scenarios",
    "ModelInfo": "scenarios",
    "Provider": "scenarios",
    "Scenario": "scenarios",
    "builtin_scenario": "scenarios",
    "load_scenario": "scenarios",
    "RunningEmulator": "server",
    "serve_forever": "server",
    "start_in_thread": "server",
}

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


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
