"""The committed reference docs equal what ``python -m draftgen.docgen`` generates from the code."""

from __future__ import annotations

from pathlib import Path

from draftgen.docgen import generate_docs, main

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_committed_docs_are_up_to_date() -> None:
    for name, text in generate_docs().items():
        path = DOCS / name
        assert path.is_file(), f"{path} is missing; run `python -m draftgen.docgen`"
        assert path.read_text(encoding="utf-8") == text, f"{path} is out of date; run `python -m draftgen.docgen`"


def test_config_reference_lists_every_key() -> None:
    import msgspec

    from draftgen.config import RunConfig

    text = generate_docs()["config.md"]

    def keys(cls: type[msgspec.Struct], prefix: str) -> list[str]:
        out = []
        for f in msgspec.structs.fields(cls):
            if f.name == "base_dir":
                continue
            key = f"{prefix}{f.name}"
            out.append(key)
            tp = f.type
            if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
                out += keys(tp, key + ".")
            elif (getattr(tp, "__origin__", None) is list and isinstance(tp.__args__[0], type)
                  and issubclass(tp.__args__[0], msgspec.Struct)):
                out += keys(tp.__args__[0], key + "[].")
        return out

    for key in keys(RunConfig, ""):
        assert f"| `{key}` |" in text, key
    assert "base_dir" not in text
    assert '`"bundled:qwen3"`' in text  # defaults are rendered
    assert "API model slug sent as" in text  # attribute docstrings are read from the source


def test_cli_reference_has_every_command_and_check_mode(tmp_path: Path) -> None:
    text = generate_docs()["cli.md"]
    for cmd in ("prepare", "generate", "audit", "merge", "probe", "plan", "run", "status", "report", "emulate"):
        assert f"## `draftgen {cmd}`" in text
        assert f"Usage: draftgen {cmd} [OPTIONS]" in text
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "cli.md").write_text("stale\n", encoding="utf-8")
    assert main(["--out", str(tmp_path), "--check"]) == 1
