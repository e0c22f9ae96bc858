"""Our LLaMA layers compute what transformers' LlamaForCausalLM computes (same weights, fp32)."""

import pytest
import torch
import transformers

from restartbench.model import DecoderLayerPipe, EmbeddingPipe, FinalNormPipe, LMHeadPipe, TensorParallel, cross_entropy
from restartbench.presets import PRESETS


def our_stack(preset, seed):
    tp = TensorParallel(1, 0)
    return torch.nn.Sequential(
        EmbeddingPipe(preset, tp, seed),
        *[DecoderLayerPipe(preset, tp, seed, layer) for layer in range(1, preset.layers + 1)],
        FinalNormPipe(preset),
        LMHeadPipe(preset, tp, seed),
    )


def hf_model_with_our_weights(preset, ours):
    config = transformers.LlamaConfig(
        vocab_size=preset.vocab_size, hidden_size=preset.hidden, intermediate_size=preset.ffn_hidden,
        num_hidden_layers=preset.layers, num_attention_heads=preset.heads, num_key_value_heads=preset.kv_heads,
        max_position_embeddings=preset.seq_len, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )
    config._attn_implementation = "sdpa"
    hf = transformers.LlamaForCausalLM(config).eval()
    embedding, *decoders, norm, head = ours
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(embedding.weight)
        for ours_layer, hf_layer in zip(decoders, hf.model.layers):
            for ours_name, hf_param in (("attn_norm", hf_layer.input_layernorm.weight),
                                        ("q", hf_layer.self_attn.q_proj.weight),
                                        ("k", hf_layer.self_attn.k_proj.weight),
                                        ("v", hf_layer.self_attn.v_proj.weight),
                                        ("o", hf_layer.self_attn.o_proj.weight),
                                        ("mlp_norm", hf_layer.post_attention_layernorm.weight),
                                        ("gate", hf_layer.mlp.gate_proj.weight), ("up", hf_layer.mlp.up_proj.weight),
                                        ("down", hf_layer.mlp.down_proj.weight)):
                hf_param.copy_(getattr(ours_layer, ours_name))
        hf.model.norm.weight.copy_(norm.weight)
        hf.lm_head.weight.copy_(head.weight)
    return hf


def test_logits_and_loss_match_transformers_llama():
    preset = PRESETS["tiny"]
    ours = our_stack(preset, seed=7).eval()
    hf = hf_model_with_our_weights(preset, ours)
    tokens = torch.randint(preset.vocab_size, (2, preset.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        our_logits = ours(tokens)
        hf_logits = hf(input_ids=tokens).logits
    torch.testing.assert_close(our_logits, hf_logits, atol=1e-5, rtol=1e-5)
    labels = tokens.roll(-1, dims=1)
    assert cross_entropy(our_logits, labels).item() == pytest.approx(
        torch.nn.functional.cross_entropy(hf_logits.reshape(-1, preset.vocab_size), labels.reshape(-1)).item(),
        rel=1e-6)


def test_rope_caches_stay_out_of_checkpoints():
    layer = DecoderLayerPipe(PRESETS["tiny"], TensorParallel(1, 0), seed=1, layer=1)
    assert set(layer.state_dict()) == {"attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down"}


def test_tensor_parallel_shards_are_slices_of_the_full_weights():
    preset = PRESETS["tiny"]
    full = DecoderLayerPipe(preset, TensorParallel(1, 0), seed=3, layer=2)
    shards = [DecoderLayerPipe(preset, TensorParallel(2, r), seed=3, layer=2) for r in range(2)]
    for name, dim in (("q", 0), ("k", 0), ("v", 0), ("gate", 0), ("up", 0), ("o", 1), ("down", 1)):
        torch.testing.assert_close(torch.cat([getattr(s, name) for s in shards], dim=dim), getattr(full, name))
