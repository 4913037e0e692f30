"""The tiny model builder: offline, loadable, and byte-identical for the same seed."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdorch.cli import app
from pools.tiny_model import EOT, TinyModelSpec, build_tiny_model


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_same_seed_gives_byte_identical_files_and_another_seed_other_weights(
    tmp_path: Path,
) -> None:
    by_cli = tmp_path / "cli"
    result = CliRunner().invoke(app, ["dev", "tiny-model", "--out", str(by_cli), "--seed", "7"])
    assert result.exit_code == 0, result.output
    again = tmp_path / "again"
    build_tiny_model(again, TinyModelSpec(seed=7))
    other = tmp_path / "other"
    build_tiny_model(other, TinyModelSpec(seed=8))

    first, second, third = files_of(by_cli), files_of(again), files_of(other)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(
        first
    )
    assert first == second  # every file, byte for byte
    assert first["model.safetensors"] != third["model.safetensors"]
    assert first["tokenizer.json"] == third["tokenizer.json"]  # the tokenizer ignores the seed


def test_model_and_tokenizer_load_with_transformers(tiny_model_dir: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (256, 2, 4)
    assert config.vocab_size == len(tokenizer) == 4096

    with safe_open(str(tiny_model_dir / "model.safetensors"), framework="pt") as weights:
        tensor = weights.get_tensor("model.embed_tokens.weight")
    assert str(tensor.dtype) == "torch.bfloat16"
    assert tuple(tensor.shape) == (4096, 256)

    ids = tokenizer("The prefill engine reads the prompt.").input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "The prefill engine reads the prompt."
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi "}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tokenizer.eos_token == EOT
