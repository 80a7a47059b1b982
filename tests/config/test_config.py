from __future__ import annotations

from pathlib import Path

import pytest

from draftgen.config import config_hash, load_config, resolve_api_key
from draftgen.errors import ConfigError

BASE = """
run_dir: runs/x
endpoint: emulator
datasets:
  - name: chat
    path: bundled:chat
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASE))
    assert cfg.endpoint.kind == "emulator"
    assert cfg.partitions.short.concurrency == 2000 and cfg.partitions.long.max_tokens == 16384
    assert cfg.run_path == tmp_path / "runs/x"


def test_overrides_apply(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASE), {"partitions.short.concurrency": 7, "budget.max_spend_usd": 3.5, "run_dir": None})
    assert cfg.partitions.short.concurrency == 7
    assert cfg.partitions.short.max_tokens == 10240
    assert cfg.budget.max_spend_usd == 3.5
    assert cfg.run_dir == "runs/x"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (BASE + "    formt: x\n", r"unknown key 'datasets\[0\]\.formt'"),
        (BASE + "partitions: {short: {concurrency: x, max_tokens: 3}}\n", r"Expected `int`.*partitions\.short\.concurrency"),
        ("run_dir: [unclosed\n", r"c\.yaml:\d+: .*fix the YAML syntax"),
        ("", r"the config file is empty"),
        ("- a\n- b\n", r"must be a YAML mapping"),
        ("run_dir: x\ndatasets: []\n", r"'datasets' is empty"),
        (BASE + "  - name: chat\n    path: other\n", r"used twice"),
        ("datasets:\n  - name: a\n", r"needs exactly one of 'path' or 'hf'"),
        (BASE + "merge: {val_fraction: 1.5}\n", r"val_fraction"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_config_hash_ignores_knobs(tmp_path: Path) -> None:
    a = load_config(_write(tmp_path, BASE))
    b = load_config(_write(tmp_path, BASE), {"partitions.short.concurrency": 3, "budget.max_spend_usd": 1.0})
    c = load_config(_write(tmp_path, BASE), {"model.id": "other/model"})
    assert config_hash(a) == config_hash(b) != config_hash(c)


def test_api_key_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(_write(tmp_path, BASE))
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="set OPENROUTER_API_KEY") as info:
        resolve_api_key(cfg)
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-abc")
    assert resolve_api_key(cfg) == "sk-or-v1-abc"
    keyfile = tmp_path / "key.txt"
    keyfile.write_text("sk-or-v1-fromfile\n")
    cfg2 = load_config(_write(tmp_path, BASE), {"endpoint.api_key_file": str(keyfile)})
    assert resolve_api_key(cfg2) == "sk-or-v1-fromfile"
    assert "sk-or" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "partitons: {}\n", "unknown key 'partitons' (did you mean 'partitions'?)"),
        (BASE + "    formt: x\n", "unknown key 'datasets[0].formt' (did you mean 'format'?)"),
        (BASE + "partitions: {long: {max_token: 5}}\n",
         "unknown key 'partitions.long.max_token' (did you mean 'max_tokens'?)"),
        (BASE + "budget: {max_spnd_usd: 3}\n", "(did you mean 'max_spend_usd'?)"),
        (BASE + "zzzz: 1\n", "unknown key 'zzzz'; check the spelling; valid keys: datasets, run_dir, model"),
    ],
)
def test_unknown_key_suggests_the_nearest(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text))
    msg = str(info.value)
    assert expected in msg and "\n" not in msg and "base_dir" not in msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "progress: fancy\n", "Invalid enum value 'fancy' at 'progress'; valid values: auto, rich, plain, off"),
        (BASE + "    format: csv\n",
         "at 'datasets[0].format'; valid values: auto, messages, sharegpt, alpaca, prompt, glaive"),
        (BASE + "    multi_turn: first\n", "at 'datasets[0].multi_turn'; valid values: last, all"),
    ],
)
def test_enum_error_lists_the_valid_values(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text))
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "routing: {sort: cheapest}\n", "at 'routing.sort'; valid values: price, throughput, latency"),
        (BASE + "routing: {sort: pric}\n", "(did you mean 'price'?)"),
        (BASE + "routing: {data_collection: maybe}\n", "at 'routing.data_collection'; valid values: allow, deny"),
        (BASE + "routing: {quantizations: [int4, fp5]}\n", "at 'routing.quantizations[1]' (did you mean 'fp8'?); valid values: int4, int8, fp4"),
        (BASE + "routing: {max_price: {promt: 1}}\n", "among the keys of 'routing.max_price' (did you mean 'prompt'?)"),
        (BASE + "reasoning: {effort: maximum}\n", "at 'reasoning.effort'"),
        (BASE + "reasoning: {effort: high, max_tokens: 100}\n", "reasoning.effort and reasoning.max_tokens are both set"),
        (BASE + "sampling: {temperature: 5}\n", "sampling.temperature 5.0 is out of range; OpenRouter accepts [0, 2]"),
        (BASE + "sampling: {top_p: 2}\n", "sampling.top_p 2.0 is out of range; OpenRouter accepts (0, 1]"),
        (BASE + "sampling: {top_p: 0}\n", "sampling.top_p 0.0 is out of range"),
        (BASE + "sampling: {logprobs: true, top_logprobs: 21}\n", "sampling.top_logprobs 21 is out of range"),
        (BASE + "sampling: {top_logprobs: 5}\n", "sampling.top_logprobs needs sampling.logprobs: true"),
        (BASE + "sampling: {stop: [a, b, c, d, e]}\n", "sampling.stop has 5 strings; OpenRouter accepts up to 4"),
    ],
)
def test_generation_settings_outside_what_openrouter_accepts_are_refused_at_load(tmp_path: Path, text: str,
                                                                                 expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text))
    assert expected in str(info.value) and "\n" not in str(info.value)
    ok = BASE + "routing: {sort: price, quantizations: [int4, fp8]}\nsampling: {temperature: 2, top_p: 1}\n"
    assert load_config(_write(tmp_path, ok)).routing.sort == "price"


def test_yaml_floats_in_exponent_form(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASE + "train: {lr: 1e-4}\nsampling: {temperature: 5E-1}\n"))
    assert cfg.train.lr == 1e-4 and cfg.sampling.temperature == 0.5


@pytest.mark.parametrize("line", ["OPENROUTER_API_KEY=sk-or-v1-abcdefabcdef", 'export OPENROUTER_API_KEY="sk-or-v1-abc"'])
def test_a_key_file_written_as_a_shell_assignment_is_spotted_and_advised_once(tmp_path: Path, line: str) -> None:
    keyfile = tmp_path / "key.txt"
    keyfile.write_text(line + "\n")
    cfg = load_config(_write(tmp_path, BASE), {"endpoint.api_key_file": str(keyfile)})
    with pytest.raises(ConfigError) as info:
        resolve_api_key(cfg)
    msg = str(info.value)
    assert "holds a shell assignment (OPENROUTER_API_KEY=…)" in msg and "remove 'OPENROUTER_API_KEY='" in msg
    assert msg.count("only the key") == 1 and "sk-or" not in msg
