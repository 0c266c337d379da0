#!/usr/bin/env python3
"""Checks the golden fixtures against an independent numpy forward written from the model spec.

Reads each tests/fixtures/golden/<name>/ checkpoint (safetensors parsed by hand, numpy only), applies
the HF -> GGUF transforms of the spec (+1 on the zero-centred norms, -exp(A_log), the DeltaNet V-head
permutation to tiled order), runs the forward of spec section 4 in float64 token by token (recurrent
DeltaNet, no chunking) and compares with logits.bin. Non-obvious choice: it also runs two variants, the
HF grouped head order without the permutation (must match too) and tiled order without the
permutation (must NOT match), to show that the fixtures catch a head-ordering mistake.

Run: python3 tools/golden/check_spec.py [--root tests/fixtures/golden] [--only NAME[,NAME]]
"""

import argparse
import json
import os
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = data[lo:hi]
        if info["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"]).astype(np.float64)
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def v_perm(nk, nv):
    """Grouped -> tiled: new head r*nk + k takes old head k*(nv/nk) + r."""
    rep = nv // nk
    return [k * rep + r for r in range(rep) for k in range(nk)]


def expand_heads(perm, d):
    return [h * d + i for h in perm for i in range(d)]


class Model:
    def __init__(self, folder, mode):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = load_safetensors(os.path.join(folder, "model.safetensors"))
        self.mode = mode  # "spec": permuted weights + tiled; "grouped": HF order; "tiled_unpermuted"
        c = self.cfg
        self.eps = c["rms_norm_eps"]
        self.nk, self.nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        rope = c["rope_parameters"]
        self.n_rot = int(c["head_dim"] * rope["partial_rotary_factor"])
        self.theta = rope["rope_theta"]
        for key in list(self.w):
            if key.endswith("norm.weight") and "linear_attn.norm" not in key:
                self.w[key] = self.w[key] + 1.0  # the converter bakes in the zero-centred +1
        if mode == "spec":
            self.permute_v()

    def permute_v(self):
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        heads = v_perm(nk, nv)
        rows = expand_heads(heads, dv)
        key_dim = nk * dk
        for i, t in enumerate(self.cfg["layer_types"]):
            if t != "linear_attention":
                continue
            p = f"model.layers.{i}.linear_attn."
            w = self.w
            qkv = w[p + "in_proj_qkv.weight"]
            w[p + "in_proj_qkv.weight"] = np.concatenate([qkv[:2 * key_dim], qkv[2 * key_dim:][rows]])
            conv = w[p + "conv1d.weight"]
            w[p + "conv1d.weight"] = np.concatenate([conv[:2 * key_dim], conv[2 * key_dim:][rows]])
            w[p + "in_proj_z.weight"] = w[p + "in_proj_z.weight"][rows]
            w[p + "out_proj.weight"] = w[p + "out_proj.weight"][:, rows]
            for name in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
                w[p + name] = w[p + name][heads]

    def k_head_of(self, j):
        if self.mode == "grouped":
            return j // (self.nv // self.nk)
        return j % self.nk

    def rope(self, x, pos):
        half = self.n_rot // 2
        inv = self.theta ** (-2.0 * np.arange(half) / self.n_rot)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.copy()
        x1, x2 = x[..., :half].copy(), x[..., half:self.n_rot].copy()
        x[..., :half] = x1 * cos - x2 * sin
        x[..., half:self.n_rot] = x2 * cos + x1 * sin
        return x

    def attention(self, p, x):
        c, w = self.cfg, self.w
        t_len = x.shape[0]
        n_head, n_kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        qg = (x @ w[p + "q_proj.weight"].T).reshape(t_len, n_head, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t_len, n_head * d)
        k = (x @ w[p + "k_proj.weight"].T).reshape(t_len, n_kv, d)
        v = (x @ w[p + "v_proj.weight"].T).reshape(t_len, n_kv, d)
        q = rms_norm(q, w[p + "q_norm.weight"], self.eps)
        k = rms_norm(k, w[p + "k_norm.weight"], self.eps)
        pos = np.arange(t_len, dtype=np.float64)
        q, k = self.rope(q, pos), self.rope(k, pos)
        mask = np.triu(np.full((t_len, t_len), -np.inf), 1)
        out = np.zeros((t_len, n_head, d))
        for h in range(n_head):
            kh = h // (n_head // n_kv)
            s = q[:, h] @ k[:, kh].T / np.sqrt(d) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, h] = s @ v[:, kh]
        out = out.reshape(t_len, n_head * d) * sigmoid(gate)
        return out @ w[p + "o_proj.weight"].T

    def deltanet(self, p, x):
        w = self.w
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        t_len = x.shape[0]
        mixed = x @ w[p + "in_proj_qkv.weight"].T
        z = (x @ w[p + "in_proj_z.weight"].T).reshape(t_len, nv, dv)
        beta = sigmoid(x @ w[p + "in_proj_b.weight"].T)
        g = -np.exp(w[p + "A_log"]) * softplus(x @ w[p + "in_proj_a.weight"].T + w[p + "dt_bias"])
        conv = w[p + "conv1d.weight"][:, 0, :]  # [conv_dim, K]
        kk = conv.shape[1]
        padded = np.concatenate([np.zeros((kk - 1, mixed.shape[1])), mixed])
        c = sum(conv[:, i][None, :] * padded[i:i + t_len] for i in range(kk))
        c = silu(c)
        q = c[:, :nk * dk].reshape(t_len, nk, dk)
        k = c[:, nk * dk:2 * nk * dk].reshape(t_len, nk, dk)
        v = c[:, 2 * nk * dk:].reshape(t_len, nv, dv)
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6)
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
        kh = [self.k_head_of(j) for j in range(nv)]
        s = np.zeros((nv, dk, dv))
        o = np.zeros((t_len, nv, dv))
        for t in range(t_len):
            qt, kt = q[t, kh], k[t, kh]  # [nv, dk]
            s = s * np.exp(g[t])[:, None, None]
            delta = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", s, kt))
            s = s + kt[:, :, None] * delta[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", s, qt) / np.sqrt(dk)
        y = rms_norm(o, w[p + "norm.weight"], self.eps) * silu(z)
        return y.reshape(t_len, nv * dv) @ w[p + "out_proj.weight"].T

    def mlp(self, p, x):
        w = self.w
        return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    def moe(self, p, x):
        c, w = self.cfg, self.w
        n_exp, top_k = c["num_experts"], c["num_experts_per_tok"]
        logits = x @ w[p + "gate.weight"].T
        prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
        prob /= prob.sum(axis=-1, keepdims=True)
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            sel = np.argsort(-prob[t], kind="stable")[:top_k]
            wt = prob[t, sel] / max(prob[t, sel].sum(), 6.1e-5)
            for e, we in zip(sel, wt):
                out[t] += we * self.mlp(f"{p}experts.{e}.", x[t:t + 1])[0]
        sh = self.mlp(p + "shared_expert.", x)
        return out + sigmoid(x @ w[p + "shared_expert_gate.weight"].T) * sh

    def forward(self, ids):
        c, w = self.cfg, self.w
        x = w["model.embed_tokens.weight"][ids]
        for i, t in enumerate(c["layer_types"]):
            p = f"model.layers.{i}."
            hn = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            if t == "full_attention":
                x = x + self.attention(p + "self_attn.", hn)
            else:
                x = x + self.deltanet(p + "linear_attn.", hn)
            hn = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + (self.moe(p + "mlp.", hn) if "num_experts" in c else self.mlp(p + "mlp.", hn))
        x = rms_norm(x, w["model.norm.weight"], self.eps)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return x @ head.T


def main():
    ap = argparse.ArgumentParser(description="check golden fixtures against a numpy spec forward")
    ap.add_argument("--root", default="tests/fixtures/golden", help="fixture root folder")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or sorted(os.listdir(args.root))
    ok = True
    for name in names:
        folder = os.path.join(args.root, name)
        with open(os.path.join(folder, "golden.json")) as f:
            golden = json.load(f)
        ids = np.array(golden["prompt"] + golden["greedy"])
        ref = np.fromfile(os.path.join(folder, "logits.bin"), dtype="<f4").reshape(len(ids), -1)
        for mode in ("spec", "grouped", "tiled_unpermuted"):
            if mode != "spec" and golden["config_summary"]["layer_types"].count("linear_attention") == 0:
                continue
            got = Model(folder, mode).forward(ids)
            diff = np.abs(got - ref)
            agree = int((got.argmax(-1) == ref.argmax(-1)).sum())
            rel = diff.max() / np.abs(ref).max()
            match = diff.max() < 1e-3
            print(f"{name:10s} {mode:17s} max|diff| {diff.max():.3e} (rel {rel:.1e}) mean {diff.mean():.1e} "
                  f"top-1 {agree}/{len(ids)} -> {'MATCH' if match else 'differs'}", flush=True)
            if (mode == "tiled_unpermuted") == match:
                ok = False
    print("ALL AS EXPECTED" if ok else "UNEXPECTED RESULT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
