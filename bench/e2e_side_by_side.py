#!/usr/bin/env python3
"""End-to-end generation, moex against transformers, on the same checkpoint in the same run.

For each model shape the script makes a random-weight checkpoint with transformers itself
(hf_checkpoints.py: save_pretrained, the layout users download), unless --work already holds
it, then measures per case (batch B, prompt length P):
  - transformers 5.x generate (dynamic cache, greedy, stop tokens off) with each experts
    implementation asked for: prefill tokens/s = B P / time of a 1-token generate, decode
    tokens/s = B (N - 1) / (time of an N-token generate - prefill time); median of --repeats
    after one warm-up;
  - moex `bench generate --json` on the same directory (its own warm-up, repeats, floors).
Prints one markdown table per model (moex's floor and fraction of floor beside both), writes
--json-out, and, with matplotlib present, a PNG of decode tokens/s against batch per model.

Usage on the GPU machine (from the repository root, moex built with CUDA):
  python3 bench/e2e_side_by_side.py --moex build/moex --models qwen1.5-moe-a2.7b \
      --cases 1x128,32x128,1x4096 --new-tokens 64 --work /tmp/e2e
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_checkpoints import log, make_checkpoint, resolve  # noqa: E402


def time_transformers(path, impl, cases, new_tokens, repeats, torch, transformers):
    """impl: an experts implementation, optionally with "+static": a static cache, with which
    transformers' generate compiles the decoding forward itself (torch.compile, its default
    compile config); the warm-up generates of each case (one per generate length) pay the
    compilation."""
    name = impl
    impl, _, variant = impl.partition("+")
    if variant not in ("", "static"):
        raise ValueError("--hf-impls: unknown variant %r in %r (known: +static)" % (variant, name))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # straight to the device where accelerate is installed
        m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=dev,
                                                              experts_implementation=impl)
    except ValueError as e:
        if "accelerate" not in str(e):
            raise
        m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                              experts_implementation=impl).to(dev)
    m.eval()
    if variant == "static":
        m.generation_config.cache_implementation = "static"
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)

    def run(ids, n):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        if dev == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t0

    for B, P in cases:
        ids = torch.randint(0, m.config.vocab_size, (B, P), generator=g).to(dev)
        try:
            run(ids, 2)  # warm-up
            if variant == "static":
                # A static cache is sized by prompt + max_new_tokens: each length the timed runs
                # use is its own compiled shape, compiled here and not in the clock.
                run(ids, 1)
                run(ids, new_tokens)
            pre = statistics.median(run(ids, 1) for _ in range(repeats))
            full = statistics.median(run(ids, new_tokens) for _ in range(repeats))
        except torch.OutOfMemoryError:
            log("transformers %s B=%d P=%d: out of memory" % (name, B, P))
            if dev == "cuda":
                torch.cuda.empty_cache()
            continue
        dec = max(full - pre, 1e-9)
        rows.append(dict(engine="transformers", impl=name, batch=B, prompt_tokens=P,
                         prefill_tokens_per_second=B * P / pre,
                         decode_tokens_per_second=B * (new_tokens - 1) / dec))
        log("transformers %s B=%d P=%d: prefill %.0f tok/s, decode %.1f tok/s" % (
            name, B, P, rows[-1]["prefill_tokens_per_second"], rows[-1]["decode_tokens_per_second"]))
    del m
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def time_moex(binary, path, impl, cases, new_tokens, repeats, device):
    cmd = [binary, "bench", "generate", "--model", path, "--device", device, "--dtype", "bfloat16",
           "--cases", ",".join("%dx%d" % c for c in cases),
           "--new-tokens", str(new_tokens), "--repeats", str(repeats), "--json"]
    if impl:
        cmd += ["--experts-implementation", impl]
    log(" ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        log("moex failed (rc=%d): %s" % (p.returncode, p.stderr.strip()[-2000:]))
        return []
    rows = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            r.update(engine="moex", impl=impl or "default")
            rows.append(r)
    return rows


def table(model, rows):
    keys = sorted({(r["prompt_tokens"], r["batch"]) for r in rows})
    out = ["### %s" % model, "",
           "| prompt | batch | engine | experts | prefill tok/s | decode tok/s | moex decode / floor | moex prefill / floor |",
           "|---|---|---|---|---|---|---|---|"]
    for P, B in keys:
        for r in [r for r in rows if (r["prompt_tokens"], r["batch"]) == (P, B)]:
            frac_d = "%.0f%%" % (100 * r["decode_fraction_of_floor"]) if "decode_fraction_of_floor" in r else ""
            frac_p = "%.0f%%" % (100 * r["prefill_fraction_of_floor"]) if "prefill_fraction_of_floor" in r else ""
            impl = r["impl"] if isinstance(r["impl"], str) else json.dumps(r["impl"])
            out.append("| %d | %d | %s | %s | %.0f | %.1f | %s | %s |" % (
                P, B, r["engine"], impl, r["prefill_tokens_per_second"], r["decode_tokens_per_second"], frac_d, frac_p))
        best_t = [r for r in rows if (r["prompt_tokens"], r["batch"]) == (P, B) and r["engine"] == "transformers"]
        best_m = [r for r in rows if (r["prompt_tokens"], r["batch"]) == (P, B) and r["engine"] == "moex"]
        if best_t and best_m:
            for what in ("decode", "prefill"):
                k = what + "_tokens_per_second"
                out.append("| | | moex / transformers best | | | | %s %.2fx | |" % (
                    what, max(r[k] for r in best_m) / max(r[k] for r in best_t)))
    return "\n".join(out)


def plot(model, rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for P in sorted({r["prompt_tokens"] for r in rows}):
        for eng, impl in sorted({(r["engine"], str(r["impl"])) for r in rows}):
            pts = sorted((r["batch"], r["decode_tokens_per_second"]) for r in rows
                         if r["prompt_tokens"] == P and r["engine"] == eng and str(r["impl"]) == impl)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="%s %s P=%d" % (eng, impl, P))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(model)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moex", required=True)
    ap.add_argument("--models", default="qwen1.5-moe-a2.7b")
    ap.add_argument("--layers", type=int, default=0, help="override the depth of every model")
    ap.add_argument("--cases", default="1x128,32x128,1x4096", help="BATCHxPROMPT,...")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hf-impls", default="batched_mm,grouped_mm",
                    help="'none' skips transformers; NAME+static: static cache (generate compiles the decode step)")
    ap.add_argument("--moex-impls", default="grouped_mm")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", default="/tmp/moex_e2e")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--plot-dir", default="")
    a = ap.parse_args()
    import torch
    import transformers
    cases = [tuple(int(v) for v in c.split("x")) for c in a.cases.split(",")]
    all_rows = {}
    for model in a.models.split(","):
        model = resolve(model)
        path = os.path.join(a.work, model + ("-%dl" % a.layers if a.layers else ""))
        make_checkpoint(model, a.layers, path, torch, transformers)
        rows = []
        for impl in [x for x in a.moex_impls.split(",") if x]:
            rows += time_moex(a.moex, path, impl, cases, a.new_tokens, a.repeats, a.device)
        for impl in [x for x in a.hf_impls.split(",") if x and x != "none"]:
            rows += time_transformers(path, impl, cases, a.new_tokens, a.repeats, torch, transformers)
        all_rows[model] = rows
        print(table(model, rows), flush=True)
        print(flush=True)
        if a.plot_dir:
            plot(model, rows, os.path.join(a.plot_dir, "e2e_%s.png" % model))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(all_rows, f, indent=1)


if __name__ == "__main__":
    main()
