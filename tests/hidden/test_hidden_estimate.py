"""Hidden-state disk estimate: arithmetic against hand-computed cases."""

from __future__ import annotations

import pytest

from draftgen.hidden.estimate import (
    DatasetTokens,
    estimate_hidden_states,
    format_bytes,
    format_hidden_report,
    hidden_states_report,
    tokens_under_cap,
)


def test_hand_computed_case() -> None:
    # 1,000 tokens × hidden 4,096 × 4 slots × 2 bytes = 32,768,000 bytes
    assert estimate_hidden_states(1000, 4096, 4, "bf16") == 32_768_000
    assert estimate_hidden_states(1000, 4096, 4, "fp8") == 16_384_000
    assert estimate_hidden_states(1000, 4096, 1, "fp32") == 16_384_000
    assert estimate_hidden_states(0, 4096) == 0


def test_kimi_reference_figures() -> None:
    bf16 = estimate_hidden_states(90_900_000, 7168, 4, "bf16")
    fp8 = estimate_hidden_states(90_900_000, 7168, 4, "fp8")
    assert bf16 == 90_900_000 * 7168 * 4 * 2 == 5_212_569_600_000
    assert (format_bytes(bf16), format_bytes(fp8)) == ("5.21 TB", "2.61 TB")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        estimate_hidden_states(1, 1, 1, "int4")
    with pytest.raises(ValueError):
        estimate_hidden_states(1, 0)


def test_report_savings_from_cap_and_dropping_a_dataset() -> None:
    rep = hidden_states_report(
        [DatasetTokens("long", tokens=8_000, tokens_uncapped=20_000, samples=2), DatasetTokens("chat", tokens=2_000)],
        hidden_size=1000, slots=4, dtype="bf16", max_seq_len=4000,
    )
    per_token = 1000 * 4 * 2
    assert rep.tokens == 10_000 and rep.bytes == 10_000 * per_token
    assert rep.tokens_uncapped == 22_000 and rep.cap_saved == 12_000 * per_token
    long, chat = rep.datasets
    assert (long.drop_saves, long.cap_saved) == (8_000 * per_token, 12_000 * per_token)
    assert (chat.drop_saves, chat.cap_saved) == (2_000 * per_token, 0)
    assert rep.by_dtype["fp8"] == rep.bytes // 2
    lines = format_hidden_report(rep, cap_options={2000: 6_000})
    assert lines[0].startswith("hidden states (4 slots × hidden 1,000 × bf16): 80 MB for 10,000 tokens")
    assert "the length cap (4,000 tokens) saves 96 MB" in lines[1]
    assert "with a cap of 2,000 tokens: 48 MB" in lines[2]
    assert lines[3].split()[:4] == ["drop", "long", "saves", "64"]


def test_tokens_under_cap_and_format() -> None:
    assert tokens_under_cap([10, 5000, 9000], 4096) == 10 + 4096 + 4096
    assert tokens_under_cap([1, 2], None) == 3
    assert format_bytes(999) == "999 B" and format_bytes(1_500_000) == "1.5 MB" and format_bytes(123e12) == "123 TB"
