"""The sweep's tiny configs (tests/support/tiny_configs.py): one model type for each class of field its rules
shrink consistently, built and run by transformers' own modeling code, and tiny."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.support.tiny_configs import tiny_config  # noqa: E402

# each a class of fields: a rotary width inside a head; latent attention's parts with an indexer's head;
# a decoder's own layers and heads; layer kinds run-length coded; a count of shared layers and per-layer sizes;
# expert counts left unset; a layer count the class derives; settings keyed by layer index; a state-space
# mixer's heads; a kind every n layers from an offset; a cycled layer pattern; a width derived as the hidden size
TYPES = ["codegen", "deepseek_v32", "bart", "gpt_neo", "gemma3n_text", "dots1", "hrm_text", "dots3_note_text",
         "mamba2", "jamba", "recurrent_gemma", "rwkv"]


@pytest.mark.parametrize("model_type", TYPES)
def test_a_model_type_is_made_tiny_and_runs(model_type: str) -> None:
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[1, 5, 7, 9]])).logits
    assert logits.shape[:2] == (1, 4)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # tiny: every size the class has was shrunk


def test_parts_of_a_head_keep_their_sums_and_splits() -> None:
    config = tiny_config("deepseek_v32")
    assert config.qk_rope_head_dim <= config.index_head_dim  # the indexer's head holds the rope part
    assert config.qk_head_dim == config.qk_nope_head_dim + config.qk_rope_head_dim
    rotary = tiny_config("gptj")
    assert rotary.rotary_dim <= rotary.n_embd // rotary.n_head
