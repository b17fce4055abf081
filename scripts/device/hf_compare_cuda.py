#!/usr/bin/env python3
"""Whole-model check of Strata's CUDA backend against Hugging Face transformers, both in bf16 on
the same GPU (issue #9; run on the device machine, see docs/numerics.md).

For each --preset it
  1. writes a random checkpoint with `strata model make-random` (optionally cut to --num-layers),
  2. computes every position's logits of a fixed prompt with `strata model logits --backend cuda`,
  3. loads the checkpoint with transformers (DeepseekV2/V3ForCausalLM, bf16, on the GPU) and
     computes the same logits,
  4. compares: ||strata - hf|| / ||hf|| over all logits, the worst row, and how often the argmax
     (the greedy token, teacher-forced) agrees; then greedy generation of --gen tokens by
     `strata generate --backend cuda` vs model.generate(do_sample=False), position by position,
  5. deletes the checkpoint (the device's disk holds one large model at a time).
Prints one summary line per preset and writes --json.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def run(cmd):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stdout}\n{r.stderr}")
    return r.stdout, time.time() - t0


def load_npy(path):
    import ast
    raw = open(path, "rb").read()
    hlen = int.from_bytes(raw[8:10], "little")
    header = ast.literal_eval(raw[10:10 + hlen].decode("latin1"))
    data = bytearray(raw[10 + hlen:])
    return torch.frombuffer(data, dtype=torch.float32).reshape(header["shape"]).clone()


def check(args, preset, num_layers):
    d = os.path.join(args.work, f"{preset}_{num_layers}")
    shutil.rmtree(d, ignore_errors=True)
    cmd = [args.strata, "model", "make-random", "--preset", preset, "--seed", str(args.seed),
           "--out", d]
    if num_layers:
        cmd += ["--num-layers", str(num_layers)]
    out, t_make = run(cmd)
    print(out.strip(), f"(make-random {t_make:.1f} s)", flush=True)
    cfg = json.load(open(os.path.join(d, "config.json")))
    rng = random.Random(1234)
    ids = [0] + [rng.randrange(1000, cfg["vocab_size"]) for _ in range(args.prompt_len - 1)]
    npy = os.path.join(args.work, f"{preset}_{num_layers}_strata.npy")
    _, t_strata = run([args.strata, "model", "logits", "--backend", "cuda", "--model", d,
                       "--ids-list", ",".join(map(str, ids)), "--out", npy])
    mine = load_npy(npy)
    gen_out, t_gen = run([args.strata, "generate", "--backend", "cuda", "--model", d,
                          "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(args.gen)])
    strata_gen = [int(t) for t in gen_out.strip().splitlines()[0].split()]
    print(f"strata (cuda): logits {t_strata:.1f} s, generate {t_gen:.1f} s: "
          f"{gen_out.strip().splitlines()[-1]}", flush=True)

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    t_load = time.time() - t0
    with torch.no_grad():
        ref = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
        gen = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=args.gen,
                             do_sample=False, min_new_tokens=args.gen)
    hf_gen = gen[0, len(ids):].tolist()
    del model
    torch.cuda.empty_cache()
    fp32 = {}
    if args.fp32_ref:
        # How far bf16 alone moves this model: transformers in fp32 as the reference for both.
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, device_map="cuda")
        model.eval()
        with torch.no_grad():
            ref32 = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
        del model
        torch.cuda.empty_cache()
        fp32 = dict(
            hf_bf16_vs_fp32_rel=float((ref - ref32).norm() / ref32.norm()),
            hf_bf16_vs_fp32_argmax=float((ref.argmax(-1) == ref32.argmax(-1)).float().mean()),
            strata_vs_fp32_rel=float((mine - ref32).norm() / ref32.norm()),
            strata_vs_fp32_argmax=float((mine.argmax(-1) == ref32.argmax(-1)).float().mean()))
        print("fp32 reference: " + ", ".join(f"{k} {v:.3e}" for k, v in fp32.items()), flush=True)
    rel = float((mine - ref).norm() / ref.norm())
    rows = [float((mine[i] - ref[i]).norm() / ref[i].norm()) for i in range(ref.shape[0])]
    agree = float((mine.argmax(-1) == ref.argmax(-1)).float().mean())
    top2 = torch.topk(ref, 2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    n = min(len(strata_gen), len(hf_gen))
    gen_equal = sum(1 for i in range(n) if strata_gen[i] == hf_gen[i]) / max(n, 1)
    first_div = next((i for i in range(n) if strata_gen[i] != hf_gen[i]), n)
    res = dict(preset=preset, num_layers=cfg["num_hidden_layers"], prompt_len=len(ids),
               rel_error=rel, worst_row_rel_error=max(rows), argmax_agree=agree,
               min_hf_top2_margin=float(margin.min()), gen_tokens=n, gen_equal=gen_equal,
               gen_first_divergence=first_div, strata_gen=strata_gen, hf_gen=hf_gen, **fp32,
               seconds=dict(make_random=t_make, strata_logits=t_strata, strata_generate=t_gen,
                            hf_load=t_load))
    ok = rel <= 1e-2 and agree >= 0.95
    print(f"RESULT {preset} layers {cfg['num_hidden_layers']}: rel {rel:.3e} (worst row "
          f"{max(rows):.3e}), argmax agree {100 * agree:.1f}% of {len(ids)}, greedy gen equal "
          f"{100 * gen_equal:.1f}% (first divergence {first_div}/{n}); hf load {t_load:.1f} s "
          f"-> {'PASS' if ok else 'FAIL'}", flush=True)
    shutil.rmtree(d, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--work", default="/tmp/hfcmp")
    ap.add_argument("--presets", default="v3-shape-4l,v2-lite-shape")
    ap.add_argument("--num-layers", default="", help="per preset, e.g. 0,8 (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--json", default="")
    ap.add_argument("--fp32-ref", action="store_true",
                    help="also run transformers in fp32 and compare both bf16 runs with it")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    presets = args.presets.split(",")
    layers = [int(x) for x in args.num_layers.split(",")] if args.num_layers else [0] * len(presets)
    results = []
    for p, nl in zip(presets, layers):
        try:
            results.append(check(args, p, nl))
        except Exception as e:  # report and go on with the next preset
            print(f"RESULT {p}: ERROR {e}", flush=True)
            results.append(dict(preset=p, error=str(e)))
        if args.json:
            json.dump(results, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
