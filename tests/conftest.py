"""Shared test fixtures: offline everywhere, the packaged SmolLM2 tokenizer, tiny random models."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Console output (rich tables, banners) is laid out for a fixed width, whatever terminal or CI runs the tests.
os.environ["COLUMNS"] = "120"


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The default model's tokenizer (converted once from the packaged GGUF, then cached)."""
    from agentrig.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture()
def tiny_model(smol_tokenizer):
    """A tiny random Llama with the default tokenizer's vocabulary."""
    from agentrig.models import tiny_random_model

    return tiny_random_model(len(smol_tokenizer))
