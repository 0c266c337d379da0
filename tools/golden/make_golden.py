#!/usr/bin/env python3
"""Golden reference outputs for Qwen3.5 (qwen35 / qwen35moe) from Hugging Face transformers.

Builds a few small random text-only models (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) with a fixed
seed, saves each with save_pretrained, and records float32 reference logits for a 300-token random
prompt (every prompt position) plus 8 greedy decode steps taken with the model's own cache. The C++
implementation converts these checkpoints and must reproduce the logits.

Non-obvious choice: every parameter is overwritten by this script's own seeded initializer (not
transformers' init, which zeroes the norms, sets dt_bias to ones and uses std 0.02), so the fixtures do
not change when transformers changes its init, and the DeltaNet decays span short and long memories so
that a bug at a chunk boundary (64/128/256) shows up in the logits.

Run (needs torch and transformers >= 5 with qwen3_5 / qwen3_5_moe; CPU is enough, a few seconds):
    python3 tools/golden/make_golden.py --out tests/fixtures/golden
Options: --device cpu|cuda (default cpu), --only NAME[,NAME] to regenerate some fixtures.
The format is described in tools/golden/README.md.
"""

import argparse
import hashlib
import importlib
import importlib.util
import json
import math
import os
import sys
import time

import numpy as np
import torch

PROMPT_LEN = 300
N_DECODE = 8

# name -> (seed, model kind, weights dtype on disk, config fields).
FIXTURES = {
    "dense_f32": (1001, "dense", "float32", dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=8, intermediate_size=128,
        full_attention_interval=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        mrope_section=[2, 1, 1], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=False)),
    "moe_f32": (1002, "moe", "float32", dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=8,
        full_attention_interval=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        mrope_section=[2, 1, 1], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=True,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32)),
    # hidden / intermediate / value_dim / H*D are multiples of 256 so the K-quants apply; tied
    # embeddings (no lm_head, like the small real checkpoints). 3 layers with 2 full-attention layers.
    "dense_256": (1003, "dense", "bfloat16", dict(
        vocab_size=256, hidden_size=256, num_hidden_layers=3, intermediate_size=256,
        layer_types=["linear_attention", "full_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, mrope_section=[3, 3, 2],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, tie_word_embeddings=True)),
    # One full-attention layer with 4 experts of 256 (the size budget allows one MoE layer; a model
    # with only DeltaNet layers cannot run in transformers: its cache needs an attention layer).
    "moe_256": (1004, "moe", "bfloat16", dict(
        vocab_size=256, hidden_size=256, num_hidden_layers=1, layer_types=["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        mrope_section=[3, 3, 2], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=64, linear_value_head_dim=64, tie_word_embeddings=True,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
        shared_expert_intermediate_size=256)),
}

COMMON = dict(rms_norm_eps=1e-6, linear_conv_kernel_dim=4, hidden_act="silu",
              max_position_embeddings=4096, rope_theta=1e7, partial_rotary_factor=0.25)


def log(*args):
    print(*args, flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_config(kind, fields):
    if kind == "dense":
        from transformers import Qwen3_5TextConfig as Config
    else:
        from transformers import Qwen3_5MoeTextConfig as Config
    f = dict(COMMON)
    f.update(fields)
    n_layer = f["num_hidden_layers"]
    if "layer_types" not in f:
        interval = f.pop("full_attention_interval")
        f["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                            for i in range(n_layer)]
    f.pop("full_attention_interval", None)
    f["rope_parameters"] = {
        "rope_type": "default", "rope_theta": f.pop("rope_theta"),
        "partial_rotary_factor": f.pop("partial_rotary_factor"),
        "mrope_section": f.pop("mrope_section"), "mrope_interleaved": True,
    }
    cfg = Config(**f)
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:
            setattr(cfg, attr, "eager")
        except Exception as e:  # noqa: BLE001 - report and go on, the model build prints the result
            log(f"  note: cannot set {attr}: {e!r}")
    return cfg


def param_std(name, shape, hidden):
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        return 2.0 / math.sqrt(hidden)
    return min(0.1, max(0.02, 1.0 / math.sqrt(shape[-1])))


def init_weights(model, seed, hidden):
    """Overwrites every parameter from one seeded generator, in sorted name order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(p.shape)
            n = torch.randn(shape, generator=g, dtype=torch.float32)
            if name.endswith("linear_attn.norm.weight"):  # plain gated norm: weight around 1
                v = 1.0 + 0.1 * n
            elif name.endswith("norm.weight"):  # zero-centred norms: (1 + w), w around 0
                v = 0.1 * n
            elif name.endswith("A_log"):  # A in [1, 16]
                v = torch.log(1.0 + 15.0 * torch.rand(shape, generator=g))
            elif name.endswith("dt_bias"):  # softplus(a + dt_bias) from ~0.003 to ~0.3
                v = -6.0 + 5.0 * torch.rand(shape, generator=g)
            elif name.endswith("conv1d.weight"):  # [conv_dim, 1, K]
                v = n / math.sqrt(shape[-1])
            else:
                v = n * param_std(name, shape, hidden)
            p.copy_(v.to(p.dtype))


def describe_paths(mods, model):
    """Prints which DeltaNet / conv kernels are available and which callables the layers hold."""
    for pkg in ("fla", "causal_conv1d", "kernels", "flash_attn"):
        log(f"  package {pkg}: {'INSTALLED' if importlib.util.find_spec(pkg) else 'absent'}")
    try:
        from transformers.utils import import_utils as iu
        for fn in ("is_flash_linear_attention_available", "is_causal_conv1d_available"):
            if hasattr(iu, fn):
                log(f"  {fn}() = {getattr(iu, fn)()}")
    except Exception as e:  # noqa: BLE001
        log(f"  import_utils probe failed: {e!r}")
    for mod in mods:
        for attr in ("is_fast_path_available", "causal_conv1d_fn", "causal_conv1d_update",
                     "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
            if hasattr(mod, attr):
                v = getattr(mod, attr)
                log(f"  {mod.__name__}.{attr} = {v!r}")
    for name, m in model.named_modules():
        if type(m).__name__.endswith("GatedDeltaNet"):
            for attr, v in sorted(vars(m).items()):
                if callable(v) and not isinstance(v, torch.nn.Module):
                    log(f"  {name}.{attr} = {getattr(v, '__module__', '')}."
                        f"{getattr(v, '__qualname__', v)}")
            break


class CallCounter:
    """Wraps a module-level function so that the run can report that it was the one called."""

    def __init__(self, mod, attr, counts):
        self.fn = getattr(mod, attr)
        self.key = f"{mod.__name__.rsplit('.', 1)[-1]}.{attr}"
        self.counts = counts
        counts.setdefault(self.key, 0)
        setattr(mod, attr, self)

    def __repr__(self):
        return f"counted({getattr(self.fn, '__module__', '')}.{getattr(self.fn, '__qualname__', self.fn)})"

    def __call__(self, *args, **kwargs):
        self.counts[self.key] += 1
        return self.fn(*args, **kwargs)


def model_class(kind):
    import transformers
    name = "Qwen3_5ForCausalLM" if kind == "dense" else "Qwen3_5MoeForCausalLM"
    return getattr(transformers, name)


def forward_logits(model, ids, **kwargs):
    out = model(input_ids=ids, **kwargs)
    return out.logits[0].float(), out


def router_gap(router_logits, top_k):
    """Smallest margin between the last chosen and the first rejected expert probability."""
    p = torch.softmax(router_logits.float(), dim=-1).sort(dim=-1, descending=True).values
    return (p[:, top_k - 1] - p[:, top_k]).min().item()


def check_rope(model, cfg, device):
    rot = model.model.rotary_emb
    n_rot = int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"])
    theta = cfg.rope_parameters["rope_theta"]
    want = 1.0 / (theta ** (torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot))
    inv = rot.inv_freq.detach().double().cpu()
    pos = torch.arange(PROMPT_LEN + N_DECODE, device=device)
    x = torch.zeros(1, 1, device=device)
    cos, sin = rot(x, pos.view(1, 1, -1).expand(3, 1, -1))
    freqs = pos.float()[:, None] * rot.inv_freq.float()[None, :]
    plain = torch.cat([freqs, freqs], dim=-1)
    d = max((cos[0] - plain.cos()).abs().max().item(), (sin[0] - plain.sin()).abs().max().item())
    log(f"  rope: n_rot={n_rot} inv_freq={inv.numel()} (max rel err vs theta^(-2i/n_rot) "
        f"{((inv - want).abs() / want).max().item():.2e}), mrope_section={getattr(rot, 'mrope_section', None)}, "
        f"cos/sin shape {tuple(cos.shape)}; text M-RoPE vs plain NEOX partial rope max diff {d:.3e}")
    return n_rot, d


def reload_check(cls, out_dir, ids, ref, device):
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    try:
        m = cls.from_pretrained(out_dir, experts_implementation="eager", **kwargs)
    except TypeError:
        m = cls.from_pretrained(out_dir, **kwargs)
    m = m.to(device).eval()
    with torch.no_grad():
        got, _ = forward_logits(m, ids, use_cache=False)
    return (got - ref).abs().max().item()


def make_fixture(name, out_root, device, counts):
    seed, kind, wdtype, fields = FIXTURES[name]
    log(f"== {name} (seed {seed}, {kind}, weights {wdtype})")
    torch.manual_seed(seed)
    cfg = make_config(kind, fields)
    cls = model_class(kind)
    model = cls(cfg).eval()
    log(f"  class {cls.__name__}, attn={model.config._attn_implementation}, "
        f"experts={getattr(model.config, '_experts_implementation', None)}, layer_types={cfg.layer_types}")
    log(f"  rope_parameters={cfg.rope_parameters}")
    init_weights(model, seed, cfg.hidden_size)
    if wdtype == "bfloat16":  # the reference uses exactly the weights that are written
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model = model.to(device)
    try:
        n_rot, rope_diff = check_rope(model, cfg, device)
    except Exception as e:  # noqa: BLE001 - a cross-check only
        log(f"  rope check failed: {e!r}")
        n_rot, rope_diff = int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]), None

    g = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (PROMPT_LEN,), generator=g).tolist()
    ids = torch.tensor([prompt], device=device)

    with torch.no_grad():
        # Prefill with the model's own hybrid cache, then greedy decode one token at a time.
        logits, out = forward_logits(model, ids, use_cache=True)
        cache = out.past_key_values
        rows = [logits]
        greedy = []
        nxt = int(logits[-1].argmax())
        for step in range(N_DECODE):
            greedy.append(nxt)
            pos = torch.tensor([[PROMPT_LEN + step]], device=device)
            step_logits, out = forward_logits(model, torch.tensor([[nxt]], device=device),
                                              past_key_values=cache, use_cache=True,
                                              position_ids=pos)
            cache = out.past_key_values
            rows.append(step_logits)
            nxt = int(step_logits[-1].argmax())
        cached = torch.cat(rows, dim=0)
        full_ids = torch.tensor([prompt + greedy], device=device)
        gaps, hooks = [], []
        for m in model.modules():
            if type(m).__name__.endswith("TopKRouter"):
                hooks.append(m.register_forward_hook(
                    lambda mod, inp, out: gaps.append(router_gap(out[0], mod.top_k))))
        full, _ = forward_logits(model, full_ids, use_cache=False)
        for h in hooks:
            h.remove()
    router_min_gap = min(gaps) if gaps else None
    if gaps:
        log(f"  router: min gap between the k-th and (k+1)-th expert probability {router_min_gap:.3e}")

    n_rows = PROMPT_LEN + N_DECODE
    assert cached.shape == (n_rows, cfg.vocab_size), cached.shape
    diff = (cached - full).abs()
    agree = int((cached.argmax(-1) == full.argmax(-1)).sum())
    top2 = cached.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    log(f"  cached decode vs full forward: max |diff| {diff.max().item():.3e} "
        f"(prompt rows {diff[:PROMPT_LEN].max().item():.3e}, decode rows {diff[PROMPT_LEN:].max().item():.3e}); "
        f"top-1 agreement {agree}/{n_rows}")
    log(f"  logits: std {cached.std().item():.4f}, max {cached.max().item():.4f}, "
        f"min {cached.min().item():.4f}; distinct argmax over prompt rows "
        f"{len(set(cached[:PROMPT_LEN].argmax(-1).tolist()))}; min top1-top2 margin on greedy rows "
        f"{margin[PROMPT_LEN - 1:].min().item():.4e}")
    log(f"  greedy: {greedy}")

    gen_ids = None
    try:
        with torch.no_grad():
            # An explicit mask: generate would otherwise mask every prompt token equal to pad_token_id.
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_DECODE,
                                 min_new_tokens=N_DECODE, do_sample=False, eos_token_id=None,
                                 pad_token_id=0, use_cache=True)
        gen_ids = gen[0, PROMPT_LEN:].tolist()
        log(f"  model.generate greedy: {gen_ids} ({'MATCHES' if gen_ids == greedy else 'DIFFERS'})")
    except Exception as e:  # noqa: BLE001 - a cross-check only
        log(f"  model.generate failed: {e!r}")

    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    save_model = model.to("cpu")
    if wdtype == "bfloat16":
        save_model = save_model.to(torch.bfloat16)
    save_model.save_pretrained(out_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(out_dir, extra)
        if os.path.exists(p):
            os.remove(p)
    cached.cpu().numpy().astype("<f4").tofile(os.path.join(out_dir, "logits.bin"))

    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        log(f"  safetensors: {len(keys)} tensors")
        for k in keys:
            if ".layers." not in k or ".layers.0." in k or ".layers.3." in k:
                t = f.get_slice(k)
                log(f"    {k} {t.get_dtype()} {list(t.get_shape())}")

    reload_diff = reload_check(cls, out_dir, full_ids, full, device)
    log(f"  reload from disk, full forward vs reference: max |diff| {reload_diff:.3e}")

    c = cfg
    summary = {
        "model_class": cls.__name__, "model_type": c.model_type, "weights_dtype": wdtype,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
        "layer_types": list(c.layer_types), "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "n_rot": n_rot,
        "rope_theta": c.rope_parameters["rope_theta"],
        "mrope_section": c.rope_parameters.get("mrope_section"),
        "linear_num_key_heads": c.linear_num_key_heads,
        "linear_num_value_heads": c.linear_num_value_heads,
        "linear_key_head_dim": c.linear_key_head_dim, "linear_value_head_dim": c.linear_value_head_dim,
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim, "rms_norm_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size, "tie_word_embeddings": bool(c.tie_word_embeddings),
    }
    if kind == "dense":
        summary["intermediate_size"] = c.intermediate_size
    else:
        summary.update(num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                       moe_intermediate_size=c.moe_intermediate_size,
                       shared_expert_intermediate_size=c.shared_expert_intermediate_size)
    golden = {
        "name": name, "prompt": prompt, "greedy": greedy, "n_decode": N_DECODE,
        "vocab_size": c.vocab_size, "logits_file": "logits.bin",
        "logits_rows": "one row per prompt position, then one per greedy step input",
        "logits_shape": [n_rows, c.vocab_size], "logits_dtype": "float32 little-endian, row-major",
        "transformers_version": importlib.import_module("transformers").__version__,
        "torch_version": torch.__version__, "seed": seed, "device": device,
        "config_summary": summary,
        "checks": {
            "cached_vs_full_max_abs_diff": diff.max().item(),
            "cached_vs_full_top1_agreement": f"{agree}/{n_rows}",
            "reload_full_forward_max_abs_diff": reload_diff,
            "text_mrope_vs_plain_rope_max_diff": rope_diff,
            "generate_matches_greedy": gen_ids == greedy if gen_ids is not None else None,
            "min_top1_margin_greedy_rows": margin[PROMPT_LEN - 1:].min().item(),
            "router_min_topk_gap": router_min_gap,
            "logits_std": cached.std().item(), "logits_max_abs": cached.abs().max().item(),
        },
        "sha256": {f: sha256(os.path.join(out_dir, f))
                   for f in ("config.json", "model.safetensors", "logits.bin")},
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    for fname in sorted(os.listdir(out_dir)):
        p = os.path.join(out_dir, fname)
        log(f"  {fname}: {os.path.getsize(p)} bytes sha256 {sha256(p)[:16]}")
    return diff.max().item(), agree == n_rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/golden", help="output root folder")
    ap.add_argument("--device", default="cpu", help="torch device (cpu or cuda)")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    import transformers
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    mods = [importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5"),
            importlib.import_module("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")]
    counts = {}
    for mod in mods:
        for attr in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                     "torch_causal_conv1d_update", "causal_conv1d_fn", "causal_conv1d_update"):
            if callable(getattr(mod, attr, None)):
                CallCounter(mod, attr, counts)

    names = [n for n in args.only.split(",") if n] or list(FIXTURES)
    ok = True
    t0 = time.time()
    for i, name in enumerate(names):
        if i == 0:
            torch.manual_seed(0)
            probe = model_class(FIXTURES[name][1])(make_config(FIXTURES[name][1], FIXTURES[name][3]))
            log("DeltaNet / conv paths:")
            describe_paths(mods, probe)
            del probe
        _, agree = make_fixture(name, args.out, args.device, counts)
        ok = ok and agree
    log(f"function calls during the run: {counts}")
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    log(f"total fixture bytes: {total}; wall {time.time() - t0:.1f} s")
    if total >= 12_000_000:
        log("WARNING: fixtures exceed the 12 MB budget")
    if not ok:
        log("WARNING: cached decode and full forward disagree on some top-1")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
