#!/usr/bin/env python3
"""Numerical reference for Strata's DeepSeek-V2/V3 CPU backend, from Hugging Face transformers.

Runs where torch + transformers exist (the GPU device machine; CPU is fine). For each preset it
  1. writes the checkpoint with Strata itself (`strata model make-random --preset P --seed S`),
  2. loads it with transformers in fp32 (failing on any missing or unexpected tensor),
  3. records, for fixed prompts, every position's logits (as a fixed subset of the vocabulary,
     the top-8 and the full-vector L2 norm, to stay small), greedy continuations, and layer 0's
     latent cache (kv_a_layernorm output) and k_pe (from the key cache),
  4. compares `strata model logits` with HF right there and prints the relative errors.
It also builds small random models with transformers itself, saves them with save_pretrained
(bf16), and checks that `strata model logits` reads them (the saved directories are copied out).

Fixtures are JSON; float32 arrays are base64 of little-endian float32. Regenerate with:
  python3 scripts/hf_reference.py --strata "<strata command>" --work /tmp/w --out OUTDIR
then copy OUTDIR/*.json into tests/compute_nodes/fixtures/ (see docs/numerics.md).
"""
import argparse
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import traceback

import torch
import transformers
from transformers import AutoModelForCausalLM

PRESETS = [("tiny", 1), ("small-v3", 2), ("small-v2", 3)]
SUBSET_STRIDE = 509
TOPK = 8
GREEDY_STEPS = 8


def b64(t):
    return base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().tobytes()).decode()


def prompts(vocab):
    rng = random.Random(1234)
    return [
        [0, 1000, 2000, 3000, 4000, 5000, 6000],
        [rng.randrange(vocab) for _ in range(20)],
        [rng.randrange(vocab) for _ in range(70)],  # crosses a 64-token page
    ]


def run_strata(strata, args):
    cmd = strata.split() + args
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stdout}\n{r.stderr}")
    return r.stdout


def load_npy(path):
    """float32 C-order .npy as written by `strata model logits` (no numpy needed)."""
    import ast
    raw = open(path, "rb").read()
    hlen = int.from_bytes(raw[8:10], "little")
    header = ast.literal_eval(raw[10:10 + hlen].decode("latin1"))
    data = bytearray(raw[10 + hlen:])
    return torch.frombuffer(data, dtype=torch.float32).reshape(header["shape"]).clone()


def strata_logits(strata, model_dir, ids, work):
    out = os.path.join(work, "strata_logits.npy")
    run_strata(strata, ["model", "logits", "--model", model_dir, "--ids-list",
                        ",".join(map(str, ids)), "--out", out])
    return load_npy(out)


def load_hf(model_dir):
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys",
                                                        "mismatched_keys")}
    if bad:
        raise RuntimeError(f"{model_dir}: loading info {bad}")
    model.eval()
    return model


def past_kv(pkv, layer):
    if hasattr(pkv, "layers"):
        return pkv.layers[layer].keys, pkv.layers[layer].values
    if hasattr(pkv, "key_cache"):
        return pkv.key_cache[layer], pkv.value_cache[layer]
    return pkv[layer][0], pkv[layer][1]


def reference_for(model, cfg, ids):
    captured = {}
    attn0 = model.model.layers[0].self_attn
    h = attn0.kv_a_layernorm.register_forward_hook(
        lambda m, i, o: captured.setdefault("latent", o.detach()))
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    h.remove()
    logits = out.logits[0].float()
    keys, values = past_kv(out.past_key_values, 0)
    nope = cfg["qk_nope_head_dim"]
    hooked = captured["latent"][0]
    if keys.shape[-1] == cfg["kv_lora_rank"]:
        # transformers 5.x caches MLA compressed: keys = latent [B, 1, T, kv_lora_rank],
        # values = k_pe [B, 1, T, rope_dim].
        latent = keys[0, 0]
        k_pe = values[0, 0]
        print(f"  cache: compressed (keys {list(keys.shape)}, values {list(values.shape)}); "
              f"latent vs kv_a_layernorm output rel {rel(latent, hooked):.3e}")
    else:  # decompressed cache: keys = cat(k_nope, k_pe) per head
        latent = hooked
        k_pe = keys[0, 0, :, nope:]
        print(f"  cache: decompressed (keys {list(keys.shape)})")
    # Greedy continuation by full forwards (independent of HF's cache path).
    seq = list(ids)
    margins = []
    with torch.no_grad():
        for _ in range(GREEDY_STEPS):
            l = model(torch.tensor([seq])).logits[0, -1].float()
            top2 = torch.topk(l, 2)
            margins.append(float(top2.values[0] - top2.values[1]))
            seq.append(int(top2.indices[0]))
    return logits, latent, k_pe, seq[len(ids):], margins


def rel(a, b):
    return float((a - b).norm() / b.norm())


def preset_fixture(strata, name, seed, work, out_dir):
    model_dir = os.path.join(work, name)
    print(run_strata(strata, ["model", "make-random", "--preset", name, "--seed", str(seed),
                              "--out", model_dir]).strip())
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    model = load_hf(model_dir)
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    print(f"{name}: HF classes {type(model).__name__} mlp per layer {kinds}")
    vocab = cfg["vocab_size"]
    subset = torch.arange(0, vocab, SUBSET_STRIDE)
    fixture = {"preset": name, "seed": seed, "transformers": transformers.__version__,
               "torch": torch.__version__, "subset_stride": SUBSET_STRIDE, "prompts": []}
    for pi, ids in enumerate(prompts(vocab)):
        logits, latent, k_pe, greedy, margins = reference_for(model, cfg, ids)
        top = torch.topk(logits, TOPK, dim=-1)
        entry = {
            "ids": ids,
            "subset_logits": b64(logits[:, subset]),
            "norms": b64(logits.norm(dim=-1)),
            "top_ids": top.indices.tolist(),
            "top_values": b64(top.values),
            "greedy": greedy,
            "greedy_min_margin": min(margins),
        }
        if pi == 0:
            entry["latent_layer0"] = b64(latent)
            entry["k_pe_layer0"] = b64(k_pe)
        fixture["prompts"].append(entry)
        try:
            mine = strata_logits(strata, model_dir, ids, work)
            print(f"{name} prompt {pi} (len {len(ids)}): strata vs HF rel {rel(mine, logits):.3e} "
                  f"argmax equal {bool((mine.argmax(-1) == logits.argmax(-1)).all())} "
                  f"greedy margin {min(margins):.3e}")
        except Exception as e:  # the fixture is still worth keeping
            print(f"{name} prompt {pi}: strata logits failed: {e}")
    path = os.path.join(out_dir, f"hf_{name.replace('-', '_')}.json")
    with open(path, "w") as f:
        json.dump(fixture, f)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * (torch.rand(p.shape, generator=g) - 0.5))
            elif p.dim() == 2 and "embed" in n:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5))
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(0.15 * torch.rand(b.shape, generator=g))


def hf_saved(strata, work, out_dir):
    common = dict(vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2,
                  kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                  n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                  max_position_embeddings=2048, tie_word_embeddings=False)
    rope_yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                 "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
                 "mscale": 1.0, "mscale_all_dim": 0.8}
    variants = [
        ("v3", transformers.DeepseekV3Config, dict(q_lora_rank=24, n_group=2, topk_group=1,
                                                   norm_topk_prob=True, routed_scaling_factor=2.5),
         rope_yarn),
        ("v2", transformers.DeepseekV2Config, dict(q_lora_rank=None, n_group=2, topk_group=1,
                                                   topk_method="group_limited_greedy",
                                                   norm_topk_prob=False,
                                                   routed_scaling_factor=2.0), None),
    ]
    for tag, cls, extra, rope in variants:
        try:
            kw = dict(common, **extra)
            if rope is not None:
                kw["rope_parameters"] = rope
            config = cls(**kw)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config).float()
            randomize(model, 7)
            d = os.path.join(work, f"hf_saved_{tag}")
            shutil.rmtree(d, ignore_errors=True)
            model.to(torch.bfloat16).save_pretrained(d)
            from safetensors import safe_open
            names = []
            for f in sorted(os.listdir(d)):
                if f.endswith(".safetensors"):
                    with safe_open(os.path.join(d, f), "pt") as sf:
                        names += list(sf.keys())
            print(f"hf_saved_{tag}: files {sorted(os.listdir(d))}; {len(names)} tensors, e.g. "
                  f"{[n for n in names if 'layers.1.' in n][:12]}")
            print(f"hf_saved_{tag} config.json: {open(os.path.join(d, 'config.json')).read()}")
            ref = load_hf(d)
            ids = [3, 17, 200, 45, 9, 128, 77, 5, 250, 31, 64, 90]
            with torch.no_grad():
                logits = ref(torch.tensor([ids])).logits[0].float()
            fixture = {"ids": ids, "logits": b64(logits), "vocab": 256}
            with open(os.path.join(d, "strata_reference.json"), "w") as f:
                json.dump(fixture, f)
            try:
                mine = strata_logits(strata, d, ids, work)
                print(f"hf_saved_{tag}: strata vs HF rel {rel(mine, logits):.3e}")
            except Exception as e:
                print(f"hf_saved_{tag}: strata logits failed: {e}")
            shutil.copytree(d, os.path.join(out_dir, f"hf_saved_{tag}"))
        except Exception:
            print(f"hf_saved_{tag}: FAILED")
            traceback.print_exc()


def dump_sources(out_dir):
    base = os.path.dirname(transformers.__file__)
    dst = os.path.join(out_dir, "transformers_src")
    os.makedirs(dst, exist_ok=True)
    for rel_path in ["models/deepseek_v3/modeling_deepseek_v3.py",
                     "models/deepseek_v3/configuration_deepseek_v3.py",
                     "models/deepseek_v2/modeling_deepseek_v2.py",
                     "models/deepseek_v2/configuration_deepseek_v2.py",
                     "modeling_rope_utils.py", "conversion_mapping.py"]:
        src = os.path.join(base, rel_path)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(dst, os.path.basename(src)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True, help="command that runs the strata binary")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default=",".join(p for p, _ in PRESETS))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"torch {torch.__version__} transformers {transformers.__version__}")
    dump_sources(args.out)
    wanted = args.presets.split(",")
    for name, seed in PRESETS:
        if name not in wanted:
            continue
        try:
            preset_fixture(args.strata, name, seed, args.work, args.out)
        except Exception:
            print(f"{name}: FAILED")
            traceback.print_exc()
    hf_saved(args.strata, args.work, args.out)


if __name__ == "__main__":
    sys.exit(main())
