"""The planner's model shapes (project/planner/model.py) against transformers: GPT-2's and Llama 3's published
configurations built on the meta device (no weights, no download), their parameters counted by
``model.parameters()``, equal to the planner's count exactly; and bad shapes refused with what to change."""
import pytest

from project.planner.model import MODELS

# (preset, vocabulary, positions): GPT-2's published sizes with its 50,257 tokens and 1024 positions (Radford et al.
# 2019), Llama 3's with 128,256 tokens (Dubey et al. 2024, Table 3; the positions do not count: rotary)
PUBLISHED = [("gpt2", 50257, 1024), ("gpt2-medium", 50257, 1024), ("gpt2-large", 50257, 1024),
             ("gpt2-xl", 50257, 1024), ("llama3.2-3b", 128256, 8192), ("llama3-8b", 128256, 8192),
             ("llama3-70b", 128256, 8192), ("llama3-405b", 128256, 8192)]


@pytest.mark.parametrize("preset,vocab,positions", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameters_equal_transformers(preset, vocab, positions):
    import torch
    import transformers

    shape = MODELS[preset]
    config = shape.transformers_config(vocab, positions)
    cls = transformers.GPT2LMHeadModel if shape.mlp == "gelu" else transformers.LlamaForCausalLM
    with torch.device("meta"):
        model = cls(config)
    counted = sum(p.numel() for p in model.parameters())  # tied weights once, as the planner counts them
    assert shape.parameters(vocab, positions)["total"] == counted


def test_the_published_sizes():
    """The counts the papers name: GPT-2's 1.5B (1,557,611,200 with its 50,257 tokens), Llama 3's 8.03B, 70.6B
    and 405.9B."""
    assert MODELS["gpt2-xl"].parameters(50257, 1024)["total"] == 1_557_611_200
    assert round(MODELS["llama3-8b"].parameters(128256, 8192)["total"] / 1e9, 2) == 8.03
    assert round(MODELS["llama3-70b"].parameters(128256, 8192)["total"] / 1e9, 1) == 70.6
    assert round(MODELS["llama3-405b"].parameters(128256, 8192)["total"] / 1e9, 1) == 405.9


def test_a_free_shape_replaces_sizes_and_bad_shapes_say_what_to_change():
    from course.config import ConfigError
    from project.planner.config import PlanConfig

    free = MODELS["gpt2"].replace(n_embd=512, n_head=8)
    assert (free.n_inner, free.n_kv_head, free.mlp) == (2048, 8, "gelu")  # GPT-2's 4 h and multi-head attention
    gqa = MODELS["llama3-8b"].replace(n_head=16)
    assert gqa.n_kv_head == 8  # the preset's grouped key/value heads kept
    config = PlanConfig.for_test(preset="llama3-8b", n_layer=4, n_kv_head=2, hardware="h100", batch_size=8,
                                 model_max_length=256)
    assert (config.model.n_layer, config.model.n_kv_head, config.vocab_size) == (4, 2, 128256)
    for values, message in ((dict(n_embd=1000, n_head=16), "does not split into 16 heads"),
                            (dict(n_kv_head=3), "key/value heads do not divide"),
                            (dict(n_embd=3072, n_head=24, n_inner=12288, tp=12), "one must divide the other")):
        with pytest.raises(ConfigError, match=message):
            PlanConfig.for_test(preset="llama3-8b", hardware="h100", batch_size=8, model_max_length=256, **values)
