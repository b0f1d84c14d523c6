#!/usr/bin/env python3
"""moex's FP8 experts against torch's own FP8 grouped GEMM, on the same GPU in the same run.

Shape: DeepSeek-V3 experts (H 7168, I 2048, top-k 8, gated SiLU; gate_up [E, 2I, H] with the gate
rows first, down [E, H, I]), E = 32 by default (--experts 32,256), uniform top-k routing over
distinct experts with softmax weights.

moex rows: `moex bench experts --device cuda --graph off --json` twice, --dtype fp8 with the
grouped_mm and deepgemm backends, --dtype bfloat16 with grouped_mm. moex checks each backend's
result (eager against its float64 reference, the others against eager) before timing it, and
times with the L2 flushed before each run (median). Its FP8 weights are 128 x 128 block-scaled,
activations bf16 in and out (its e4m3 tensor-core paths quantize them per 1 x 128 block).

torch rows: the same layer written with torch._scaled_grouped_mm (2d activations x 3d weights,
`offs` = cumulative row ends per expert). Weights are e4m3 with row-wise scales (one float32
per output row, amax / 448), activations quantized row-wise at run time. Row-wise is the scaling
torch's grouped FP8 GEMM takes on Hopper: its dispatch (aten/src/ATen/native/cuda/GroupedBlas.cpp)
knows row-wise, MXFP8, MXFP4 and NVFP4 recipes only, and torch's own tests run the row-wise one
on SM90 and MXFP8 on SM100 only, so there is no 128 x 128 block-scaled grouped FP8 GEMM to call
on an H100 / H200. Row-wise scales are applied once in the epilogue, less work than block
scales, so any advantage of the scaling goes to torch. Two torch rows:
  - "torch FP8 forward": sort the (token, slot) pairs by expert, gather, quantize, gate_up GEMM,
    silu(gate) * up, quantize, down GEMM, routing weights, index_add back to [T, H];
  - "torch FP8 GEMMs only": the two _scaled_grouped_mm calls on inputs quantized beforehand.
Before timing, the forward is compared, on a sample of tokens, with float32 forwards of the same
(dequantized) weights: one that rounds the activations as the FP8 forward does (relative L2
error at most --tol; what a wrong layout or scale would break) and one that does not (at most
2 x --tol; the two e4m3 roundings of the activations alone cost about 4.5 % there). Both errors
are printed; a failed check or an exception (e.g. a layout or alignment refusal) marks the row
failed in a '#' line and the script goes on. Timing: triton.testing.do_bench (median, L2 flushed
before each run) when triton imports, else CUDA events around each run after an L2 flush,
median. TFLOP/s = T k (2 H 2I + 2 I H) / time; speedups = the other's ms / moex's best FP8 ms.

Usage (on the GPU machine):

  python3 bench/fp8_side_by_side.py --moex build/moex --experts 32 --tokens 256,4096,8192,16384
"""
import argparse
import json
import math
import subprocess
import sys
import time

H, I, K = 7168, 2048, 8  # DeepSeek-V3 experts: hidden, intermediate, top-k
E4M3_MAX = 448.0


def flops(T):
    return T * K * (2 * H * 2 * I + 2 * I * H)


def run_moex(args, E, dtype, backends, tokens):
    cmd = [args.moex, "bench", "experts", "--device", "cuda", "--dtype", dtype, "--backends", ",".join(backends),
           "--experts", str(E), "--top-k", str(K), "--hidden", str(H), "--intermediate", str(I),
           "--tokens", ",".join(str(t) for t in tokens), "--graph", "off", "--json"]
    for flag in ("budget_s", "min_iters", "bandwidth_gbs", "peak_tflops"):
        if getattr(args, flag) is not None:
            cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    cmd += args.moex_args.split()
    print("#", " ".join(cmd), flush=True)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.moex_timeout or None)
    except (OSError, subprocess.TimeoutExpired) as e:
        print("# moex bench could not run: %s" % e, flush=True)
        return []
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip().startswith("{")]
    if p.returncode != 0:
        print("# moex bench failed (rc=%d): %s" % (p.returncode, p.stderr.strip()[-2000:]), flush=True)
    print("# moex bench %s %s took %.1f s" % (dtype, ",".join(backends), time.time() - t0), flush=True)
    return rows


def moex_rows(args, E, dtype, backends, tokens):
    """{(backend, T): ms}. A failing backend (refused, or a failed check) ends moex's whole run, so
    the backends that lack rows are run again one at a time for their missing token counts."""
    got = {(r["backend"], r["tokens"]): r["ms"] for r in run_moex(args, E, dtype, backends, tokens)}
    if len(backends) > 1:
        for b in backends:
            missing = [t for t in tokens if (b, t) not in got]
            if missing:
                got.update({(r["backend"], r["tokens"]): r["ms"] for r in run_moex(args, E, dtype, [b], missing)})
    return got


# ---- torch ----

def quant_rows(x, torch):
    """[M, N] -> (e4m3 [M, N], float32 [M]) with x ~ q * scale per row, scale = amax / 448."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale.squeeze(-1).contiguous()


def make_weights(E, torch, dev, seed):
    """e4m3 gate_up [E, 2I, H], down [E, H, I] and their row scales [E, 2I], [E, H]. Quantized one
    expert at a time: only one expert's float weights exist at once."""
    g = torch.Generator(device=dev).manual_seed(seed)
    w = {}
    for name, (N, Kd) in (("gate_up", (2 * I, H)), ("down", (H, I))):
        q = torch.empty(E, N, Kd, dtype=torch.float8_e4m3fn, device=dev)
        s = torch.empty(E, N, dtype=torch.float32, device=dev)
        for e in range(E):
            wf = torch.randn(N, Kd, device=dev, generator=g) / math.sqrt(Kd)
            q[e], s[e] = quant_rows(wf.to(torch.bfloat16), torch)
            del wf
        w[name], w[name + "_scale"] = q, s
    return w


def make_forward(w, E, torch, fast_accum):
    F = torch.nn.functional
    # _scaled_grouped_mm wants mat_b column-major: the transpose view of the contiguous [E, N, K]
    # e4m3 weights ([E, K, N], strides (N K, 1, K)), mat_a row-major [M, K], scale_a [M] and
    # scale_b [E, N] float32, offs int32 [E] (cumulative row ends, empty groups allowed), K and N
    # multiples of 16, bf16 out. Group sizes need no padding in this 2d x 3d form: the 16-byte
    # checks on group sizes (aten/src/ATen/native/cuda/GroupMMCommon.cuh) are for the 2d x 2d one
    # and for a column-major mat_a, so none is added.
    w1, w1s = w["gate_up"].transpose(-2, -1), w["gate_up_scale"]
    w2, w2s = w["down"].transpose(-2, -1), w["down_scale"]

    def gmm(aq, a_scale, b, b_scale, offs):
        return torch._scaled_grouped_mm(aq, b, a_scale, b_scale, offs=offs, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast_accum)

    def route(idx):
        flat = idx.reshape(-1)
        order = flat.argsort()
        # Counts by scatter_add (bincount's output size depends on the data: torch.compile breaks).
        counts = torch.zeros(E, dtype=torch.int32, device=idx.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        return order, order // idx.shape[1], counts.cumsum(0).to(torch.int32)

    def act(gu):  # silu(gate) * up, quantized for the down GEMM
        return quant_rows(F.silu(gu[:, :I].float()) * gu[:, I:].float(), torch)

    def forward(hidden, idx, rw):
        order, tok, offs = route(idx)
        xq, xs = quant_rows(hidden.index_select(0, tok), torch)
        aq, as_ = act(gmm(xq, xs, w1, w1s, offs))
        y = gmm(aq, as_, w2, w2s, offs).float() * rw.reshape(-1)[order, None]
        out = torch.zeros(hidden.shape[0], H, dtype=torch.float32, device=hidden.device)
        return out.index_add_(0, tok, y).to(torch.bfloat16)

    def gemm_inputs(hidden, idx):
        """The GEMMs-only row's inputs, quantized outside the timed region (the down GEMM's input
        is the activated output of the gate_up one, so both GEMMs see the forward's data)."""
        _, tok, offs = route(idx)
        xq, xs = quant_rows(hidden.index_select(0, tok), torch)
        aq, as_ = act(gmm(xq, xs, w1, w1s, offs))
        return xq, xs, aq, as_, offs

    def gemms_only(xq, xs, aq, as_, offs):
        gmm(xq, xs, w1, w1s, offs)
        return gmm(aq, as_, w2, w2s, offs)

    return forward, gemm_inputs, gemms_only


def reference(w, hidden, idx, rw, torch, quantized):
    """float32 forward of the dequantized weights, one expert at a time, written independently of
    the sort / offs path it checks. quantized: the activations rounded as the FP8 forward rounds
    them (e4m3 per row, gate_up out in bf16), so that only a wrong GEMM shows; else unquantized."""
    def q(x):
        if not quantized:
            return x
        xq, xs = quant_rows(x, torch)
        return xq.float() * xs[:, None]
    out = torch.zeros(hidden.shape[0], H, dtype=torch.float32, device=hidden.device)
    x = q(hidden.float())
    for e in idx.unique().tolist():
        tok, slot = (idx == e).nonzero(as_tuple=True)
        w1 = w["gate_up"][e].float() * w["gate_up_scale"][e][:, None]
        w2 = w["down"][e].float() * w["down_scale"][e][:, None]
        gu = x[tok] @ w1.t()
        if quantized:
            gu = gu.to(torch.bfloat16).float()
        a = q(torch.nn.functional.silu(gu[:, :I]) * gu[:, I:])
        out.index_add_(0, tok, (a @ w2.t()) * rw[tok, slot][:, None])
    return out


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def make_timer(torch):
    """(timer(fn) -> median ms, its name). Both flush the L2 before each timed run, as moex does."""
    try:
        from triton.testing import do_bench
        # rep in ms: 300 keeps several runs at the largest T (tens of ms each) for the median.
        return (lambda fn: do_bench(fn, warmup=25, rep=300, return_mode="median")), "triton do_bench"
    except ImportError:
        pass
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # larger than the L2

    def timer(fn, warmup=5, iters=30):
        for _ in range(warmup):
            fn()
        ms = []
        for _ in range(iters):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        return sorted(ms)[len(ms) // 2]
    return timer, "CUDA events"


def torch_rows(args, E, tokens, torch, timer, dev="cuda"):
    """{T: {"forward": ms | None, "gemms": ms | None, "rel_err": float | None, "error": str}}."""
    res = {}
    try:
        w = make_weights(E, torch, dev, seed=E)
    except Exception as e:  # e.g. out of memory
        print("# torch E=%d: making the FP8 weights failed: %s" % (E, str(e)[:300]), flush=True)
        return {T: {"forward": None, "gemms": None, "rel_err": None, "error": str(e)[:300]} for T in tokens}
    forward, gemm_inputs, gemms_only = make_forward(w, E, torch, args.fast_accum == "yes")
    for T in tokens:
        r = res[T] = {"forward": None, "gemms": None, "rel_err": None, "rel_err_quantized_ref": None, "error": ""}
        g = torch.Generator(device=dev).manual_seed(1000 + T)
        hidden = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
        top = torch.rand(T, E, device=dev, generator=g).topk(K, dim=-1)  # k distinct experts
        idx, rw = top.indices, torch.softmax(top.values, dim=-1)
        fwd = forward
        try:
            if args.compile == "yes":
                torch._dynamo.reset()
                fwd = torch.compile(forward, dynamic=False)
            with torch.no_grad():
                out = fwd(hidden, idx, rw)  # also the compile / warm-up
                # The check: a sample of tokens spread over [0, T) (a token depends on itself only).
                rows = torch.linspace(0, T - 1, min(T, args.check_tokens), device=dev).long().unique()
                sample = (w, hidden[rows], idx[rows], rw[rows], torch)
                err_q = rel_l2(out[rows].float(), reference(*sample, quantized=True))
                err = rel_l2(out[rows].float(), reference(*sample, quantized=False))
            r["rel_err"], r["rel_err_quantized_ref"] = err, err_q
            # The activations' e4m3 rounding alone costs about 4.5 % against the unquantized
            # reference (two row-wise roundings), too close to --tol to tell a wrong GEMM from it:
            # the gate is the reference that rounds them the same way; the other gets 2 x --tol.
            if not (err_q <= args.tol and err <= 2 * args.tol):
                raise RuntimeError("relative L2 error %.3g against the float32 reference with the same "
                                   "activation rounding (allowed %.3g), %.3g against the unquantized one "
                                   "(allowed %.3g): not timing a wrong result" % (err_q, args.tol, err, 2 * args.tol))
            print("# torch E=%d T=%d: forward checked, relative L2 error %.3g (same activation rounding), "
                  "%.3g (unquantized activations)" % (E, T, err_q, err), flush=True)
            with torch.no_grad():
                r["forward"] = timer(lambda: fwd(hidden, idx, rw))
                inputs = gemm_inputs(hidden, idx)
                r["gemms"] = timer(lambda: gemms_only(*inputs))
            print("# torch E=%d T=%d: forward %.4f ms, GEMMs only %.4f ms" % (E, T, r["forward"], r["gemms"]),
                  flush=True)
        except Exception as e:  # a layout / alignment refusal, a failed check, out of memory
            r["error"] = "%s: %s" % (type(e).__name__, str(e).strip()[:500])
            print("# torch E=%d T=%d failed: %s" % (E, T, r["error"].replace("\n", " ")), flush=True)
        finally:
            hidden = idx = rw = out = inputs = None
            if dev == "cuda":
                torch.cuda.empty_cache()
    del w, forward, gemm_inputs, gemms_only
    if dev == "cuda":
        torch.cuda.empty_cache()  # before the next E's moex runs
    return res


def cell(ms, T, failed=False):
    if ms is None:
        return "failed" if failed else "-"
    return "%.4f (%.0f)" % (ms, flops(T) / ms / 1e9)


def table(E, tokens, moex, tr, compiled):
    print("\n### E=%d, k=%d, H=%d, I=%d: ms (TFLOP/s); speedups: the other's ms / moex's best FP8 ms\n"
          % (E, K, H, I))
    print("| T | moex fp8 grouped_mm | moex fp8 deepgemm | moex bf16 grouped_mm | torch FP8 forward%s "
          "| torch FP8 GEMMs only | moex best fp8 / torch forward | moex best fp8 / moex bf16 |"
          % (" (compiled)" if compiled else ""))
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for T in tokens:
        fg, fd = moex.get(("fp8", "grouped_mm", T)), moex.get(("fp8", "deepgemm", T))
        bf = moex.get(("bfloat16", "grouped_mm", T))
        t = tr.get(T, {})
        best = min([m for m in (fg, fd) if m is not None], default=None)
        sp_t = "%.2fx" % (t["forward"] / best) if best and t.get("forward") else "-"
        sp_b = "%.2fx" % (bf / best) if best and bf else "-"
        failed = bool(t.get("error"))
        print("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
            T, cell(fg, T), cell(fd, T), cell(bf, T), cell(t.get("forward"), T, failed),
            cell(t.get("gemms"), T, failed), sp_t, sp_b))
        rows.append({"experts": E, "top_k": K, "hidden": H, "intermediate": I, "tokens": T, "flops": flops(T),
                     "moex_fp8_grouped_mm_ms": fg, "moex_fp8_deepgemm_ms": fd, "moex_bf16_grouped_mm_ms": bf,
                     "torch_fp8_forward_ms": t.get("forward"), "torch_fp8_gemms_only_ms": t.get("gemms"),
                     "torch_forward_compiled": compiled, "torch_rel_err": t.get("rel_err"),
                     "torch_rel_err_same_rounding": t.get("rel_err_quantized_ref"),
                     "torch_error": t.get("error") or None})
    sys.stdout.flush()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moex", default="build/moex", help="the moex binary (built with CUDA)")
    ap.add_argument("--experts", default="32", help="experts per layer, comma-separated (32, 256)")
    ap.add_argument("--tokens", default="256,4096,8192,16384", help="e.g. 1,16,256,1024,4096,8192,16384")
    ap.add_argument("--budget-s", type=float, default=None, help="passed to moex bench (it bounds CPU rows)")
    ap.add_argument("--min-iters", type=int, default=None, help="passed to moex bench (CUDA: it times max(N, 20) runs)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None, help="passed to moex bench: skip measuring it")
    ap.add_argument("--peak-tflops", type=float, default=None, help="passed to moex bench: skip measuring it")
    ap.add_argument("--moex-args", default="", help="more arguments for moex bench experts")
    ap.add_argument("--moex-timeout", type=float, default=0, help="seconds per moex run (0: none)")
    ap.add_argument("--compile", default="no", choices=["yes", "no"], help="torch.compile the torch forward")
    ap.add_argument("--fast-accum", default="no", choices=["yes", "no"],
                    help="use_fast_accum of _scaled_grouped_mm (no: the accumulation DeepGEMM-style kernels keep)")
    ap.add_argument("--tol", type=float, default=5e-2, help="relative L2 error allowed for the torch forward")
    ap.add_argument("--check-tokens", type=int, default=64, help="tokens checked against the reference")
    ap.add_argument("--skip-moex", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    experts = [int(e) for e in args.experts.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    if min(experts) < K or min(tokens) < 1:
        ap.error("--experts must be >= top-k (%d) and --tokens >= 1" % K)

    torch = timer = None
    if not args.skip_torch:  # imported here: --help and --skip-torch runs need no torch
        import torch
        timer, timer_name = make_timer(torch)
        print("# %s UTC, %s, torch %s, timer %s, compile %s, use_fast_accum %s" % (
              time.strftime("%Y-%m-%d %H:%M", time.gmtime()), torch.cuda.get_device_name(0), torch.__version__,
              timer_name, args.compile, args.fast_accum), flush=True)
    all_rows = []
    for E in experts:
        moex = {}
        if not args.skip_moex:  # first, while torch holds no weights on the GPU
            for dtype, backends in (("fp8", ["grouped_mm", "deepgemm"]), ("bfloat16", ["grouped_mm"])):
                for (b, T), ms in moex_rows(args, E, dtype, backends, tokens).items():
                    moex[(dtype, b, T)] = ms
        tr = {} if args.skip_torch else torch_rows(args, E, tokens, torch, timer)
        all_rows += table(E, tokens, moex, tr, args.compile == "yes")
        if args.json_out:  # after every E: a run cut short keeps what it measured
            with open(args.json_out, "w") as f:
                json.dump(all_rows, f, indent=1)


if __name__ == "__main__":
    main()
