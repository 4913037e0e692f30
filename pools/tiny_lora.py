"""A tiny random-weight LoRA adapter for the tiny Llama (`pools/tiny_model.py`), in PEFT format.

The real-engine LoRA test needs an adapter vLLM loads (`--enable-lora --lora-modules
name=path`) and none can be downloaded, so this writes one: `adapter_config.json` (PEFT's
`LoraConfig` fields vLLM reads: `peft_type`, `r`, `lora_alpha`, `target_modules`, ...) and
`adapter_model.safetensors` with `base_model.model.model.layers.{i}.self_attn.{q,v}_proj.
lora_{A,B}.weight` (A: rank x in, B: out x rank), drawn from a fixed seed in the tiny model's
shapes. vLLM's `--max-lora-rank` must be >= `rank`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pools.tiny_model import TinyModelSpec

TARGET_MODULES = ("q_proj", "v_proj")


def build_tiny_lora(
    out_dir: Path,
    base_model_dir: Path,
    spec: TinyModelSpec | None = None,
    *,
    rank: int = 8,
    seed: int = 1,
) -> list[Path]:
    """Write the adapter for the tiny model of `spec` (built in `base_model_dir`) to
    `out_dir`; returns the files written."""
    import torch
    from safetensors.torch import save_file

    spec = spec or TinyModelSpec()
    head_dim = spec.hidden_size // spec.num_attention_heads
    out_features = {
        "q_proj": spec.num_attention_heads * head_dim,
        "v_proj": spec.num_key_value_heads * head_dim,
    }
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(spec.num_hidden_layers):
        for module in TARGET_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.randn(rank, spec.hidden_size, generator=generator) * 0.02
            b = torch.randn(out_features[module], rank, generator=generator) * 0.02
            tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / "adapter_model.safetensors"
    save_file(tensors, str(weights))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    config_path = out_dir / "adapter_config.json"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return [config_path, weights]
