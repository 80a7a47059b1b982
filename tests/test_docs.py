"""The committed reference docs equal what ``python -m draftgen.docgen`` generates from the code; the sections
the README and the errors point to are there; every test file named by its path exists."""

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


def _documented_defaults(text: str) -> dict[str, str]:
    """key → default cell of every row of docs/config.md's tables."""
    import re

    row = re.compile(r"^\| `([^`]+)` \| `(?:[^`]*)` \| (\*\*required\*\*|\(section\)|–|`[^`]*`) \| ", re.M)
    return {m.group(1): m.group(2) for m in row.finditer(text)}


def test_every_documented_default_is_the_codes_default(tmp_path: Path) -> None:
    """Each default in docs/config.md is what the loader fills in when the file leaves the key out; each
    key marked required is one whose absence the loader refuses."""
    import msgspec
    import pytest

    from draftgen.config import DatasetConfig, config_from_mapping
    from draftgen.errors import ConfigError

    minimal = {"datasets": [{"name": "a", "path": "x"}]}
    cfg = config_from_mapping(minimal, where="c.yaml", base_dir=tmp_path)
    dataset = DatasetConfig(name="a")  # the dataset's own defaults (minimal sets its path)
    documented = _documented_defaults((DOCS / "config.md").read_text(encoding="utf-8"))
    assert len(documented) > 50 and "partitions.long.max_tokens" in documented
    for key, cell in documented.items():
        if cell == "**required**":
            data: dict[str, object] = {}
            if key.startswith("datasets[]."):
                field = key.split(".", 1)[1]
                data = {"datasets": [{k: v for k, v in minimal["datasets"][0].items() if k != field}]}
            else:
                data = {k: v for k, v in minimal.items() if k != key}
            with pytest.raises(ConfigError):
                config_from_mapping(data, where="c.yaml", base_dir=tmp_path)
            continue
        obj: object = dataset if key.startswith("datasets[].") else cfg
        for part in key.removeprefix("datasets[].").split("."):
            obj = getattr(obj, part)
        if cell == "(section)":
            assert isinstance(obj, msgspec.Struct), key
        elif cell == "–":
            assert obj is None, key
        else:
            assert cell == f"`{msgspec.json.encode(msgspec.to_builtins(obj)).decode()}`", key
    assert documented["partitions.long.max_tokens"] == "`16384`"
    assert documented["partitions.short.concurrency"] == "`2000`"


def test_the_vllm_backend_section_the_readme_and_the_error_point_to_is_there() -> None:
    """README and the ``not_extract_mode`` error link docs/extract.md#the-vllm-backend: the section gives the
    versions checked, every serve flag and the sizing for the reference target (issue 23)."""
    import re

    root = DOCS.parent
    text = (DOCS / "extract.md").read_text(encoding="utf-8")
    section = text.split("\n## The vllm backend\n", 1)[1].split("\n## ", 1)[0]
    for must in ("vLLM 0.33.0", ">= 0.22.0", "#46973", "extract_hidden_states", "ExampleHiddenStatesConnector",
                 "--no-enable-chunked-prefill", "enable_chunked_prefill=False", "--no-enable-prefix-caching",
                 "Kimi-K2.5", "8 × H200", "--tensor-parallel-size 8", "[2, 30, 58, 61]", "Sources:"):
        assert must in section, must
    assert "docs/extract.md#the-vllm-backend" in (root / "README.md").read_text(encoding="utf-8")
    vllm = (root / "src" / "draftgen" / "target" / "vllm.py").read_text(encoding="utf-8")
    assert re.search(r"docs/extract\.md#the-vllm-backend\)\", kind=\"not_extract_mode\"", vllm)


def test_resume_and_reruns_says_what_is_kept_redone_and_refused() -> None:
    text = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Resume and reruns\n", 1)[1].split("\n## ", 1)[0]
    for must in ("**Kept.**", "**Redone.**", "**Refused.**", "--redo changed", "--redo truncated", "replaced.jsonl",
                 "--force"):
        assert must in section, must


def test_every_test_file_named_by_its_path_exists() -> None:
    """README, docs, pyproject, scripts, bench and the docstrings and comments of src and tests name tests by
    their path (``tests/<package>/test_x.py``); each one is there, so a test that moves takes its mentions
    along."""
    import re

    root = DOCS.parent
    files = [root / "README.md", root / "pyproject.toml", *DOCS.glob("*.md"), *(root / "scripts").iterdir(),
             *(root / "bench").glob("*.py"), *(root / "src").rglob("*.py"), *(root / "tests").rglob("*.py")]
    named = {(f.relative_to(root), m) for f in files if f.is_file()
             for m in re.findall(r"(?<![\w/.])tests/[\w/]+\.py\b", f.read_text(encoding="utf-8"))}
    assert len(named) > 20  # the scan finds the mentions
    missing = sorted(f"{where}: {path}" for where, path in named if not (root / path).is_file())
    assert not missing, "test files named but not there (moved? renamed?):\n" + "\n".join(missing)
