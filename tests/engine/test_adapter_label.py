"""The label of a LoRA adapter as an engine's GET /v1/models lists it (vLLM's shape: the base model has no parent,
each loaded adapter names its base as parent and the directory it was loaded from as root)."""

from __future__ import annotations

from services.engine.control import adapter_label, served_adapter_label

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
