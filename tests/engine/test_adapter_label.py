"""The label of a LoRA adapter as an engine's GET /v1/models lists it (vLLM's shape: the base model has no parent,
each loaded adapter names its base as parent and the directory it was loaded from as root)."""

from __future__ import annotations

from pathlib import Path

from services.engine.control import adapter_base_mismatch, adapter_label, served_adapter_label

MODELS = {
    "object": "list",
    "data": [
        {"id": "agl-base", "root": "/models/base", "parent": None},
        {"id": "agl-policy", "root": "/w/adapter-v3", "parent": "agl-base"},
    ],
}


def test_an_adapter_is_labelled_by_the_directory_it_was_loaded_from() -> None:
    assert served_adapter_label(MODELS, "agl-policy") == adapter_label("/w/adapter-v3") == "adapter:/w/adapter-v3"


def test_a_missing_adapter_or_a_base_model_of_that_name_is_none() -> None:
    assert served_adapter_label(MODELS, "other-run") == "adapter:none"
    assert served_adapter_label(MODELS, "agl-base") == "adapter:none"  # a base model is not an adapter
    assert served_adapter_label({"data": None}, "agl-policy") == "adapter:none"
    assert served_adapter_label([], "agl-policy") == "adapter:none"


def test_an_adapter_of_another_base_model_is_refused_with_both_names(tmp_path: Path) -> None:
    assert adapter_base_mismatch({"base_model_name_or_path": "/models/other"}, MODELS) == (
        "the adapter was trained on base model /models/other, the engine serves /models/base"
    )
    # The same model: the same path, resolved (a link, a trailing slash), or its hub id against its download folder.
    (tmp_path / "base").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "base")
    linked = {"data": [{"id": "agl-base", "root": str(tmp_path / "base"), "parent": None}]}
    for base in (str(tmp_path / "link"), f"{tmp_path / 'base'}/", "/models/base", "org/base"):
        assert adapter_base_mismatch({"base_model_name_or_path": base}, {**MODELS, **linked}) is None, base
    assert adapter_base_mismatch({"base_model_name_or_path": "org/base"}, MODELS) is None
    # Nothing to tell by: no base in the config, no base model among the cards.
    assert adapter_base_mismatch({}, MODELS) is None
    assert adapter_base_mismatch({"base_model_name_or_path": "/x"}, {"data": [MODELS["data"][1]]}) is None
