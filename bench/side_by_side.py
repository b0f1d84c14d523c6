#!/usr/bin/env python3
"""moex's experts backends (batched_mm, grouped_mm, deepgemm, sonicmoe) and transformers' (eager,
batched_mm, grouped_mm; compiled and not) side by side on the same GPU, in the same run.

Runs `moex bench experts --device cuda --json` (moex's own harness: it checks each backend against
the float64 reference before timing, measures the ceilings and prints the floor of each row) and
then times transformers' experts module of the same shape with the same kind of routing
(uniform top-k, distinct experts, softmax weights) through triton.testing.do_bench (median,
L2 flushed before each run by zeroing 256 MB; moex's timer is told to flush the same way).
Prints one markdown table per shape: every time, the floor (from moex's bench: max(bytes of the
experts hit + activations / measured bandwidth, flops / measured peak)), moex's best fraction
of the floor, and moex's speedup over transformers' best. Usage (on the GPU machine):

  python3 bench/side_by_side.py --moex build-cuda/moex --shapes all --tokens 1,4,16,64,256,1024,4096,16384

lab/cuda/side_by_side.sh runs it with the settings of the H200 table in docs/cuda.md.

Rows "transformers + moex" (--py-impls, default moex_grouped_mm,moex_batched_mm): the same
transformers experts module with experts_implementation set to a moex backend registered by
moex.transformers.register(), i.e. moex called through the Python path (custom op, zero-copy
DLPack, torch's current stream). Needs the moex Python module built with CUDA
(-DMOEX_PYTHON=ON -DMOEX_CUDA=ON, PYTHONPATH=build-cuda/python); each such output is checked
against transformers' grouped_mm before it is timed. --py-impls '' leaves them out.

transformers' experts modules are all the same gated-SiLU function of (E, k, H, I) for these three
shapes; the script instantiates Qwen2MoeExperts with each shape's sizes.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

SHAPES = {
    "qwen1.5-moe-a2.7b": (60, 4, 2048, 1408),
    "deepseek-v3": (256, 8, 7168, 2048),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}


def run_moex(binary, shape, tokens, graph, backends="batched_mm,grouped_mm", extra=()):
    cmd = [binary, "bench", "experts", "--device", "cuda", "--shape", shape, "--dtype", "bfloat16",
           "--tokens", ",".join(str(t) for t in tokens), "--graph", graph, "--json",
           "--backends", backends] + list(extra)
    # do_bench flushes the L2 by zeroing a 256 MB buffer; moex's timer flushes the same way here
    # (its default is a read, which leaves no dirty lines to write back during the timed run).
    env = dict(os.environ, MOEX_BENCH_L2_FLUSH="write")
    print("# MOEX_BENCH_L2_FLUSH=write", " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    if p.returncode != 0:
        print("# moex bench failed (rc=%d): %s" % (p.returncode, p.stderr.strip()[-2000:]), flush=True)
    print("# moex bench %s took %.1f s" % (shape, time.time() - t0), flush=True)
    return rows


def make_hf_experts(E, H, I, torch):
    from transformers.models.qwen2_moe.configuration_qwen2_moe import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeExperts
    cfg = Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                         num_experts_per_tok=1, hidden_act="silu")
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            ex = Qwen2MoeExperts(cfg)
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():
        for name, p in ex.named_parameters():
            fan_in = p.shape[-1]
            p.normal_(0.0, 1.0 / math.sqrt(fan_in))
    return ex.eval(), cfg


def set_impl(cfg, name):
    try:
        cfg._experts_implementation = name
    except Exception:
        cfg._experts_implementation_internal = name


_COMPILED = {}


def load_moex_python():
    """moex's Python module with its transformers backends registered; exits with the reason when
    it cannot time them (not importable, or built without CUDA)."""
    try:
        import moex
        import moex.transformers
    except ImportError as e:
        sys.exit("side_by_side.py: the moex Python module is not importable (%s); build it with "
                 "-DMOEX_PYTHON=ON -DMOEX_CUDA=ON and set PYTHONPATH=<build>/python, or pass "
                 "--py-impls ''" % e)
    if not moex.built_with_cuda:
        sys.exit("side_by_side.py: the moex Python module at %s was built without CUDA; rebuild it "
                 "with -DMOEX_CUDA=ON -DMOEX_PYTHON=ON, or pass --py-impls ''" % moex.__file__)
    moex.transformers.register()
    return moex


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def time_hf(torch, do_bench, ex, cfg, impl, compiled, hidden, idx, w, compile_mode="max-autotune", dynamic="static"):
    set_impl(cfg, impl)
    fn = ex.forward
    if compiled:
        # "max-autotune": grouped_mm autotuned (max-autotune-no-cudagraphs), batched_mm default;
        # "default": plain torch.compile for both. dynamic="static" compiles every (impl, T) afresh
        # (shape-specialised kernels, the fastest, minutes per shape); "auto" keeps one compiled
        # function per impl and lets dynamo mark T dynamic after the first size (two compiles).
        mode = None
        if compile_mode == "max-autotune" and impl == "grouped_mm":
            mode = "max-autotune-no-cudagraphs"
        if dynamic == "static":
            torch._dynamo.reset()
            fn = torch.compile(ex.forward, mode=mode, dynamic=False)
        else:
            if impl not in _COMPILED:
                _COMPILED[impl] = torch.compile(ex.forward, mode=mode, dynamic=None)
            fn = _COMPILED[impl]
    with torch.no_grad():
        t0 = time.time()
        out = fn(hidden, idx, w)  # compile / warm up
        torch.cuda.synchronize()
        if compiled:
            print("# compile/warm-up %s: %.1f s" % (impl, time.time() - t0), flush=True)
        ms = do_bench(lambda: fn(hidden, idx, w), warmup=10, rep=60, return_mode="median")
    return ms, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moex", default="build-cuda/moex")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--tokens", default="1,4,16,64,256,1024,4096,16384")
    ap.add_argument("--compile", default="yes", choices=["yes", "no"])
    ap.add_argument("--compile-mode", default="max-autotune", choices=["max-autotune", "default"])
    ap.add_argument("--compile-dynamic", default="static", choices=["static", "auto"])
    ap.add_argument("--hf-impls", default="eager,batched_mm,grouped_mm",
                    help="transformers backends to time (uncompiled, and compiled unless --compile no)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--py-impls", default="moex_grouped_mm,moex_batched_mm",
                    help="moex backends timed inside transformers' experts module (uncompiled); '' = none")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--batched-max-tokens", type=int, default=1 << 30,
                    help="time moex's batched_mm only up to this T (it streams one expert per pair, "
                         "so it is minutes per call at large T on big experts)")
    ap.add_argument("--moex-args", default="", help="extra arguments for moex bench, e.g. '--budget-s 1'")
    ap.add_argument("--deepgemm", default="yes", choices=["yes", "no"],
                    help="also time moex's deepgemm backend (Hopper only; a refusal is printed, not fatal)")
    ap.add_argument("--sonicmoe", default="yes", choices=["yes", "no"],
                    help="also time moex's sonicmoe backend (Hopper only; a refusal is printed, not fatal)")
    args = ap.parse_args()
    shapes = list(SHAPES) if args.shapes == "all" else args.shapes.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    py_impls = [i for i in args.py_impls.split(",") if i]
    if py_impls:
        load_moex_python()  # before any timing: a module that cannot run fails the script at once

    import torch
    from triton.testing import do_bench
    import transformers
    gpu = torch.cuda.get_device_name(0)
    print("# %s UTC, %s, torch %s, transformers %s; compile %s (mode %s, shapes %s)" % (
          time.strftime("%Y-%m-%d %H:%M", time.gmtime()), gpu, torch.__version__,
          transformers.__version__, args.compile, args.compile_mode, args.compile_dynamic), flush=True)
    all_rows = []
    for shape in shapes:
        E, k, H, I = SHAPES[shape]
        extra = args.moex_args.split()
        small = [t for t in tokens if t <= args.batched_max_tokens]
        moex_rows = run_moex(args.moex, shape, tokens, "both", "grouped_mm", extra)
        if small:
            moex_rows += run_moex(args.moex, shape, small, "both", "batched_mm", extra)
        if args.deepgemm == "yes":
            moex_rows += run_moex(args.moex, shape, tokens, "both", "deepgemm", extra)
        if args.sonicmoe == "yes":
            moex_rows += run_moex(args.moex, shape, tokens, "both", "sonicmoe", extra)
        hf, py = {}, {}
        if not args.skip_hf or py_impls:
            ex, cfg = make_hf_experts(E, H, I, torch)
            expert_bytes = 3 * H * I * 2
            for T in tokens:
                g = torch.Generator(device="cuda").manual_seed(1000 + T)
                hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
                scores = torch.rand(T, E, device="cuda", generator=g)
                top = scores.topk(k, dim=-1)
                idx = top.indices
                w = torch.softmax(top.values, dim=-1).to(torch.float32)
                for impl in py_impls:
                    # Through the Python path; checked against transformers' grouped_mm first.
                    # Not compiled: the custom op is one graph node, compile adds nothing to it.
                    if impl == "moex_batched_mm" and T > args.batched_max_tokens:
                        continue
                    try:
                        set_impl(cfg, "grouped_mm")
                        with torch.no_grad():
                            ref = ex(hidden, idx, w)
                        ms, out = time_hf(torch, do_bench, ex, cfg, impl, False, hidden, idx, w)
                        err = rel_l2(out.float(), ref.float())
                        if not err <= 2e-2:
                            print("# py %s T=%d %s: WRONG (rel L2 %.3g vs transformers' grouped_mm), "
                                  "not reported" % (shape, T, impl, err), flush=True)
                            continue
                        py[(T, impl)] = ms
                        print("# py %s T=%d %s: %.4f ms (rel L2 %.2g)" % (shape, T, impl, ms, err), flush=True)
                    except Exception as e:
                        print("# py %s T=%d %s failed: %s" % (shape, T, impl, str(e)[:200]), flush=True)
                        torch.cuda.empty_cache()
                for impl in ([] if args.skip_hf else args.hf_impls.split(",")):
                    # batched_mm copies the selected experts' weights per (token, slot).
                    if impl == "batched_mm" and T * k * expert_bytes > 40e9:
                        continue
                    for compiled in ([False, True] if args.compile == "yes" else [False]):
                        if compiled and impl == "eager":
                            continue  # eager's data-dependent loop graph-breaks; compile adds nothing
                        key = impl + (" compiled" if compiled else "")
                        try:
                            ms, _ = time_hf(torch, do_bench, ex, cfg, impl, compiled, hidden, idx, w,
                                            args.compile_mode, args.compile_dynamic)
                            hf[(T, key)] = ms
                            print("# hf %s T=%d %s: %.4f ms" % (shape, T, key, ms), flush=True)
                        except Exception as e:  # OOM or a compile failure: report, keep going
                            print("# hf %s T=%d %s failed: %s" % (shape, T, key, str(e)[:200]), flush=True)
                            torch.cuda.empty_cache()
            del ex
            _COMPILED.clear()
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        # One table per shape.
        print("\n### %s (E=%d, k=%d, H=%d, I=%d), bf16\n" % (shape, E, k, H, I))
        print("| T | floor ms | moex batched_mm | moex batched_mm graph | moex grouped_mm | moex grouped_mm graph "
              "| moex deepgemm | moex deepgemm graph | moex sonicmoe | moex sonicmoe graph | moex best / floor "
              "| transformers best | its ms | speedup | transformers + moex best | its ms | its speedup |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for T in tokens:
            mr = {(r["backend"], r["graph"]): r for r in moex_rows if r["tokens"] == T}
            if not mr:
                print("| %d | (moex bench gave no row) |" % T)
                continue
            floor = next(iter(mr.values()))["floor_ms"]
            cells = []
            for key in [("batched_mm", False), ("batched_mm", True), ("grouped_mm", False), ("grouped_mm", True),
                        ("deepgemm", False), ("deepgemm", True), ("sonicmoe", False), ("sonicmoe", True)]:
                cells.append("%.4f" % mr[key]["ms"] if key in mr else "-")
            best = min(r["ms"] for r in mr.values())
            hf_t = {kk: v for (t, kk), v in hf.items() if t == T}
            if hf_t:
                hk = min(hf_t, key=hf_t.get)
                hms = hf_t[hk]
                sp = "%.2fx" % (hms / best)
            else:
                hk, hms, sp = "-", float("nan"), "-"
            py_t = {kk: v for (t, kk), v in py.items() if t == T}
            if py_t:
                pk = min(py_t, key=py_t.get)
                pcells = "%s | %.4f | %s" % (pk, py_t[pk], "%.2fx" % (hms / py_t[pk]) if hf_t else "-")
            else:
                pcells = "- | - | -"
            print("| %d | %.4f | %s | %.0f%% | %s | %.4f | %s | %s |" % (
                T, floor, " | ".join(cells), 100 * floor / best, hk, hms, sp, pcells))
            all_rows.append({"shape": shape, "tokens": T, "floor_ms": floor, "moex": {
                "%s%s" % (b, " graph" if g else ""): r["ms"] for (b, g), r in mr.items()},
                "hf": hf_t, "transformers+moex": py_t})
        sys.stdout.flush()
        if args.json_out:  # after every shape: a run cut short keeps what it measured
            with open(args.json_out, "w") as f:
                json.dump(all_rows, f, indent=1)


if __name__ == "__main__":
    main()
