#!/usr/bin/env python3
"""Prints the parts of the installed transformers' qwen3_5 / qwen3_5_moe code that the C++ forward must match.

Used to re-check the facts listed in tools/golden/README.md when the transformers version changes: the
norm parameterization, DeltaNet head grouping and kernels, the M-RoPE recomposition for text, and the
MoE router. Non-obvious choice: it prints source text (inspect.getsource) rather than summarising, so a
reader sees exactly what the version in use does.

Run: python3 tools/golden/describe_hf.py > hf_qwen35_source.txt
"""

import importlib
import inspect
import sys

import torch
import transformers

TARGETS = {
    "transformers.models.qwen3_5.modeling_qwen3_5": [
        "Qwen3_5RMSNorm", "Qwen3_5RMSNormGated", "Qwen3_5TextRotaryEmbedding", "apply_rotary_pos_emb",
        "Qwen3_5Attention.forward", "Qwen3_5GatedDeltaNet.__init__", "Qwen3_5GatedDeltaNet.forward",
        "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "l2norm",
        "Qwen3_5TextModel.forward", "Qwen3_5PreTrainedModel._init_weights",
    ],
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe": [
        "Qwen3_5MoeTopKRouter", "Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeExperts",
    ],
}


def main():
    print(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__}")
    for mod_name, names in TARGETS.items():
        mod = importlib.import_module(mod_name)
        print(f"#### {mod_name} ({mod.__file__})")
        for name in names:
            obj = mod
            try:
                for part in name.split("."):
                    obj = getattr(obj, part)
                obj = inspect.unwrap(obj)
                print(f"---- {name}\n{inspect.getsource(obj)}")
            except (AttributeError, TypeError, OSError) as e:
                print(f"---- {name}: not found ({e!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
