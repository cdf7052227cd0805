"""docs/config.md is generated from the config schema and must match it."""

from pathlib import Path

from refinery.config import RefineryConfig
from refinery.config_doc import render, sections

REPO = Path(__file__).resolve().parents[1]


def test_docs_config_md_is_up_to_date():
    assert (REPO / "docs" / "config.md").read_text() == render(), (
        "docs/config.md is stale: regenerate it with `python -m refinery.config_doc > docs/config.md`"
    )


def test_every_section_and_field_is_documented():
    doc = render()
    for path, model in sections(RefineryConfig):
        assert (f"## `{path}`" if path else "## Top level") in doc
        for name, info in model.model_fields.items():
            if not info.exclude:
                assert f"| `{name}` |" in doc, (path, name)
    # the source fields a newcomer needs, with their defaults and what they do
    assert "| `text_field` | str | `\"text\"` | JSONL, Parquet and HF datasets: the field (column) holding" in doc
    assert "| `url_field` | str | `\"url\"` |" in doc and "| `id_field` | str \\| null | `null` |" in doc
    # a comment in the schema (refinery/config/) becomes the description
    assert "| `url_blocklist` | list[str] | `[]` | Domains; subdomains match too. |" in doc
