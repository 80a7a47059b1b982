"""Import weight: the phases and the CLI load the emulator only when they start it.

Each check runs a fresh interpreter (``sys.modules`` of the test process is already full) and reads back
the module names it loaded. Reads and writes nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = (
    "import json, sys\n"
    "import draftgen.phases.generate.run, draftgen.phases.plan.run, draftgen.cli, draftgen.phases.pipeline, draftgen.phases.probe.run\n"
    "print(json.dumps(sorted(sys.modules)))\n"
)


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    names: list[str] = json.loads(out.stdout)
    return names


def test_phases_and_cli_load_no_emulator_module_nor_aiohttp_web() -> None:
    loaded = _loaded(_PROBE)
    emulator = [m for m in loaded if m.startswith("draftgen.emulator.")]
    assert emulator == [], emulator
    assert "aiohttp.web" not in loaded


def test_emulator_names_still_import_on_first_use() -> None:
    code = (
        "import json, sys\n"
        "import draftgen.emulator as e\n"
        "before = sorted(m for m in sys.modules if m.startswith('draftgen.emulator.'))\n"
        "from draftgen.emulator import EmulatorOptions, builtin_scenario, start_in_thread\n"
        "assert sorted(e._HOME) == sorted(e.__all__)\n"
        "assert all(hasattr(e, n) for n in e.__all__)\n"
        "print(json.dumps(before + ['|'] + sorted(sys.modules)))\n"
    )
    names = _loaded(code)
    cut = names.index("|")
    assert names[:cut] == []  # the package alone loads none of its modules
    assert "draftgen.emulator.server" in names[cut + 1:] and "aiohttp.web" in names[cut + 1:]
