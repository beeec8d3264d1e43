"""The tiny Qwen3 builder: complete, Qwen3-shaped and deterministic (no MLX needed)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.numpy import load_file
from tokenizers import Tokenizer

from tests.models import tiny_qwen3


def test_build_writes_every_file(tmp_path: Path) -> None:
    path = tiny_qwen3.build(tmp_path / "tiny")
    assert sorted(p.name for p in path.iterdir()) == sorted(tiny_qwen3.FILES)


def test_build_is_deterministic(tmp_path: Path) -> None:
    first = tiny_qwen3.build(tmp_path / "a")
    second = tiny_qwen3.build(tmp_path / "b")
    for name in tiny_qwen3.FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_config_describes_a_small_tied_qwen3(tmp_path: Path) -> None:
    path = tiny_qwen3.build(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    assert config["hidden_size"] == 64
    assert config["num_hidden_layers"] == 2
    assert config["num_attention_heads"] == 4
    assert config["num_key_value_heads"] == 2
    assert config["head_dim"] == 16
    assert config["intermediate_size"] == 128
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 2048
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert config["vocab_size"] == tokenizer.get_vocab_size(with_added_tokens=True)
    assert config["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    assert config["bos_token_id"] == tokenizer.token_to_id("<|endoftext|>")


def test_weights_have_the_qwen3_names_and_shapes(tmp_path: Path) -> None:
    path = tiny_qwen3.build(tmp_path)
    config = json.loads((path / "config.json").read_text())
    weights = load_file(str(path / "model.safetensors"))
    per_layer = {
        "input_layernorm.weight": (64,),
        "post_attention_layernorm.weight": (64,),
        "self_attn.q_proj.weight": (64, 64),
        "self_attn.k_proj.weight": (32, 64),
        "self_attn.v_proj.weight": (32, 64),
        "self_attn.o_proj.weight": (64, 64),
        "self_attn.q_norm.weight": (16,),
        "self_attn.k_norm.weight": (16,),
        "mlp.gate_proj.weight": (128, 64),
        "mlp.up_proj.weight": (128, 64),
        "mlp.down_proj.weight": (64, 128),
    }
    expected = {
        "model.embed_tokens.weight": (config["vocab_size"], 64),
        "model.norm.weight": (64,),
    }
    for layer in range(2):
        expected |= {f"model.layers.{layer}.{name}": shape for name, shape in per_layer.items()}
    assert {name: tuple(array.shape) for name, array in weights.items()} == expected
    assert all(str(array.dtype) == "float32" for array in weights.values())


def test_tokenizer_has_the_chat_and_reranker_tokens(tmp_path: Path) -> None:
    path = tiny_qwen3.build(tmp_path)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    for token in ("yes", "no", "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert token in vocab, token
    assert 200 < tokenizer.get_vocab_size() < 1000
    encoded = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\nyes<|im_end|>")
    assert encoded.tokens[0] == "<|im_start|>"
    assert "<think>" in encoded.tokens
    assert "</think>" in encoded.tokens
    assert encoded.tokens[-2:] == ["yes", "<|im_end|>"]
    # Byte-level: any text round-trips.
    text = "Grüße, 東京! yes/no 42"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_tokenizer_config_carries_a_chatml_template(tmp_path: Path) -> None:
    path = tiny_qwen3.build(tmp_path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in config["chat_template"]
    assert "<think>" in config["chat_template"]
    generation = json.loads((path / "generation_config.json").read_text())
    model_config = json.loads((path / "config.json").read_text())
    assert generation["eos_token_id"][0] == model_config["eos_token_id"]
