#!/usr/bin/env python3
"""End-to-end generation on the host, moex against llama.cpp, on the same checkpoint in one run.

For each model shape (hf_checkpoints.py; default: Qwen1.5-MoE-A2.7B and OLMoE-1B-7B, 4 layers,
bf16) the script
  1. makes a random-weight Hugging Face checkpoint with transformers, with a real tokenizer saved
     beside it, unless --work already holds one made from the same recipe;
  2. builds llama.cpp from --llama-cpp DIR (CPU, its CMake, native flags; llama-bench plus
     bench/llama_greedy.cpp linked against libllama) unless --skip-build, and converts the
     checkpoint to a bf16 GGUF with llama.cpp's own convert_hf_to_gguf.py (cached in --work);
  3. times both engines with the same threads on a --prompt-tokens prompt and --new-tokens new
     tokens, median of --repeats:
       moex:      `moex bench generate --device cpu --json` (prefill and decode tokens/s, floors),
                  `moex generate` timed here from process start to exit (load and packing included);
       llama.cpp: llama-bench pp<P> and tg<N> at depth P (decode after a P-token prompt, as moex
                  measures it), and llama_greedy (the examples/simple loop with ids in and out)
                  timed here from process start to exit;
     the peak resident set of every child is its ru_maxrss (os.wait4);
  4. checks greedy agreement: the first --agree-tokens greedy ids of both engines from the same
     prompt ids (random weights in bf16: the two usually agree for the first ~15 tokens, until a
     near-tie in the logits goes the other way under different rounding).
Prints one markdown table per model with both engines and their ratio, and the llama.cpp commit.

Without --llama-cpp only moex is run (the table says so).

The tokenizer: llama.cpp's converter needs a tokenizer.json and recognises its pre-tokenizer by
hashing how it splits a fixed text. The default tokenizer (tests/data/tokenizers/qwen2_bytelevel,
a small byte-level BPE trained with the Qwen2 split regex) is not one of the hashes it knows, so
the conversion tells it the pre-tokenizer is "qwen2", which is the regex the tokenizer was trained
with; ids the tokenizer lacks become padding entries of the GGUF vocabulary. OLMoE's own
tokenizer (GPT-NeoX) is not available offline; the same Qwen2-style tokenizer (1500 ids, fewer
than OLMoE's 50304) serves it, and nothing timed depends on the tokenizer (prompts are ids).

Rerun (from the repository root, after `ninja -C BUILD moex`):
  /path/to/venv/bin/python bench/cpu_side_by_side.py --moex BUILD/moex --work /data/cpu-bench \
      --llama-cpp /path/to/llama.cpp [--skip-build] [--models qwen2_moe,olmoe] [--threads 2]
The venv needs torch, transformers, numpy and gguf (the converter's needs).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from hf_checkpoints import checkpoint_key, log, make_checkpoint, resolve  # noqa: E402

DEFAULT_TOKENIZER = os.path.join(REPO, "tests", "data", "tokenizers", "qwen2_bytelevel", "tokenizer.json")
LLAMA_TARGETS = ["llama-bench", "llama"]


def run_child(cmd, env=None, stderr_to=None, cwd=None):
    """Runs cmd; returns (returncode, stdout text, wall seconds, peak RSS bytes of the child).

    The child's stdout goes to a temporary file (no pipe to drain) and os.wait4 reaps it, so that
    ru_maxrss is that child's alone. stderr goes to `stderr_to` (a path) or ours.
    """
    with tempfile.TemporaryFile(mode="w+") as out:
        err = open(stderr_to, "w") if stderr_to else None
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if err:
            err.close()
        out.seek(0)
        return p.returncode, out.read(), wall, ru.ru_maxrss * 1024  # Linux: kilobytes


def loadavg():
    """The 1 / 5 / 15-minute load averages, kept with every timing (a shared machine's noise)."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def tail(path, n=3000):
    try:
        with open(path) as f:
            return f.read()[-n:]
    except OSError:
        return ""


def check(rc, what, stderr_path=None):
    if rc != 0:
        raise RuntimeError("%s failed (exit %d)%s" % (what, rc, (":\n" + tail(stderr_path)) if stderr_path else ""))


# ---------------------------------------------------------------------------------------------
# llama.cpp: build, convert, time


def llama_commit(src):
    """The commit of the llama.cpp tree: git's, else the LLAMA_CPP_COMMIT file a source archive
    may carry (write one beside CMakeLists.txt when the tree is not a git checkout)."""
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    marker = os.path.join(src, "LLAMA_CPP_COMMIT")
    if os.path.exists(marker):
        with open(marker) as f:
            return f.read().strip() + " (from LLAMA_CPP_COMMIT, not a git checkout)"
    return "unknown (not a git checkout, no LLAMA_CPP_COMMIT file)"


def build_llama(src, build, jobs):
    log("building llama.cpp in %s (-j%d; a first build takes a while)" % (build, jobs))
    cfg = ["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
           "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    if shutil.which("ccache"):
        cfg += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    subprocess.run(cfg, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "-j", str(jobs), "--target"] + LLAMA_TARGETS, check=True)


def build_greedy(src, build, out):
    lib = os.path.join(build, "bin")
    cmd = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", os.path.join(HERE, "llama_greedy.cpp"),
           "-I", os.path.join(src, "include"), "-I", os.path.join(src, "ggml", "include"),
           "-L", lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib, "-o", out]
    subprocess.run(cmd, check=True)


# Runs llama.cpp's converter with one change: the pre-tokenizer is named instead of recognised by
# hash (see the module doc); everything else is the converter's own code path.
CONVERT = r"""
import sys
src, pre = sys.argv[1], sys.argv[2]
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[3:]
sys.path.insert(0, src)
import convert_hf_to_gguf as c
try:
    from conversion.base import TextModel
except ImportError:
    TextModel = c.TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
c.main()
"""


def convert_gguf(src, checkpoint, gguf, pre):
    if os.path.exists(gguf):
        log("using", gguf)
        return
    tmp = gguf + ".partial"
    log("converting %s -> %s" % (checkpoint, gguf))
    t0 = time.time()
    subprocess.run([sys.executable, "-c", CONVERT, src, pre, checkpoint, "--outtype", "bf16", "--outfile", tmp],
                   check=True, stdout=subprocess.DEVNULL)
    os.replace(tmp, gguf)
    log("converted in %.0f s" % (time.time() - t0))


def time_llama_bench(bench_bin, gguf, threads, P, N, repeats, work):
    """llama-bench pp<P>, then tg<N> at depth P (and in an empty context, llama-bench's usual
    tg); medians of its samples; the peak RSS is the larger of the two processes'."""
    res = dict(peak_rss_bytes=0)
    for extra in (["-p", str(P), "-n", "0"], ["-p", "0", "-n", str(N), "-d", "%d,0" % P]):
        cmd = [bench_bin, "-m", gguf, "-t", str(threads), "-r", str(repeats), "-o", "json"] + extra
        log(" ".join(cmd))
        errf = os.path.join(work, "llama-bench.stderr")
        rc, out, wall, rss = run_child(cmd, stderr_to=errf)
        check(rc, "llama-bench", errf)
        rows = json.loads(out)
        res["peak_rss_bytes"] = max(res["peak_rss_bytes"], rss)
        res.setdefault("loadavg", []).append(loadavg())
        for r in rows:
            ts = statistics.median(r["samples_ts"])
            depth = r.get("n_depth", 0)
            if r["n_prompt"] == P and r["n_gen"] == 0:
                res["prefill_tokens_per_second"] = ts
            elif r["n_gen"] == N and r["n_prompt"] == 0:
                res["decode_tokens_per_second" if depth == P else "decode_tokens_per_second_depth0"] = ts
            res["build_commit"] = r.get("build_commit", "")
            res["cpu_info"] = r.get("cpu_info", "")
            log("llama-bench %s" % json.dumps({k: r.get(k) for k in ("n_prompt", "n_gen", "n_depth", "avg_ts")}))
    return res


def time_llama_greedy(greedy_bin, gguf, threads, ids, N, repeats):
    cmd = [greedy_bin, gguf, str(threads), str(N), ",".join(map(str, ids))]
    log("%s %s %d %d <%d ids>" % (greedy_bin, gguf, threads, N, len(ids)))
    runs = []
    for _ in range(repeats):
        rc, out, wall, rss = run_child(cmd)
        check(rc, "llama_greedy")
        j = json.loads(out.strip().splitlines()[-1])
        j.update(wall_s=wall, peak_rss_bytes=rss, loadavg=loadavg())
        runs.append(j)
    return runs


# ---------------------------------------------------------------------------------------------
# moex


def moex_env(threads):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def time_moex_bench(moex, ckpt, threads, P, N, repeats):
    cmd = [moex, "bench", "generate", "--model", ckpt, "--device", "cpu", "--dtype", "bfloat16",
           "--cases", "1x%d" % P, "--new-tokens", str(N), "--repeats", str(repeats), "--json"]
    log("OMP_NUM_THREADS=%d %s" % (threads, " ".join(cmd)))
    rc, out, wall, rss = run_child(cmd, env=moex_env(threads))
    check(rc, "moex bench generate")
    row = json.loads([l for l in out.splitlines() if l.startswith("{")][0])
    row.update(child_peak_rss_bytes=rss, bench_wall_s=wall, loadavg=loadavg())
    return row


def time_moex_generate(moex, ckpt, threads, ids, N, repeats):
    cmd = [moex, "generate", "--model", ckpt, "--device", "cpu", "--dtype", "bfloat16", "--greedy",
           "--max-new-tokens", str(N), "--prompt-ids", ",".join(map(str, ids))]
    log("OMP_NUM_THREADS=%d %s --max-new-tokens %d --prompt-ids <%d ids>" % (
        threads, " ".join(cmd[:9]), N, len(ids)))
    runs = []
    for _ in range(repeats):
        rc, out, wall, rss = run_child(cmd, env=moex_env(threads))
        check(rc, "moex generate")
        j = json.loads(out)
        runs.append(dict(wall_s=wall, peak_rss_bytes=rss, ids=j["sequences"][0][len(ids):],
                         load_seconds=j.get("load_seconds"), prepare_seconds=j.get("prepare_seconds"),
                         loadavg=loadavg()))
    return runs


# ---------------------------------------------------------------------------------------------
# report


def agreement(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def fmt_ratio(m, l, higher_is_better=True):
    if not m or not l:
        return ""
    return "%.2fx" % (m / l)


def table(model, m_bench, m_gen, l_bench, l_greedy, agree, n_agree):
    gb = 1e9
    med = statistics.median
    rows = [
        ("prefill tok/s (pp%d)" % m_bench["prompt_tokens"], m_bench["prefill_tokens_per_second"],
         l_bench and l_bench.get("prefill_tokens_per_second"), "%.1f"),
        ("decode tok/s (tg%d after %d)" % (m_bench["new_tokens"], m_bench["prompt_tokens"]),
         m_bench["decode_tokens_per_second"], l_bench and l_bench.get("decode_tokens_per_second"), "%.2f"),
        ("decode tok/s (tg%d, empty context)" % m_bench["new_tokens"], None,
         l_bench and l_bench.get("decode_tokens_per_second_depth0"), "%.2f"),
        ("peak RSS of the bench run, GB", m_bench["child_peak_rss_bytes"] / gb,
         l_bench and l_bench["peak_rss_bytes"] / gb, "%.2f"),
        ("wall time of a %d-token run incl. load, s" % m_bench["new_tokens"], med(r["wall_s"] for r in m_gen),
         l_greedy and med(r["wall_s"] for r in l_greedy), "%.2f"),
        ("peak RSS of that run, GB", med(r["peak_rss_bytes"] for r in m_gen) / gb,
         l_greedy and med(r["peak_rss_bytes"] for r in l_greedy) / gb, "%.2f"),
        # llama.cpp maps the GGUF and reads its pages during the first forward, so its "load" is
        # short and the reading shows up in the wall time and the first forward instead.
        ("load (moex: + expert packing; llama.cpp: mmap only), s", med(r["load_seconds"] + r["prepare_seconds"] for r in m_gen),
         l_greedy and med(r["load_s"] for r in l_greedy), "%.2f"),
    ]
    out = ["### %s" % model, "",
           "| | moex | llama.cpp | moex / llama.cpp |", "|---|---|---|---|"]
    for name, m, l, f in rows:
        lower_better = "GB" in name or ", s" in name
        ratio = fmt_ratio(m, l)
        out.append("| %s | %s | %s | %s%s |" % (name, f % m if m is not None else "", f % l if l else "",
                                                ratio, " (lower is better)" if ratio and lower_better else ""))
    out.append("")
    out.append("moex against its floors: decode %.0f%% of %.2f ms/token (%.1f GB/s read bandwidth), "
               "prefill %.0f%% of %.0f ms (%.2f TFLOP/s peak, %s); load %.1f s, expert packing %.1f s; "
               "resident after load %.2f GB, peak %.2f GB." % (
                   100 * m_bench["decode_fraction_of_floor"], m_bench["decode_floor_ms"], m_bench["bandwidth_gbps"],
                   100 * m_bench["prefill_fraction_of_floor"], m_bench["prefill_floor_ms"], m_bench["peak_tflops"],
                   m_bench.get("kernel_unit", "?"), m_bench["load_seconds"], m_bench["prepare_seconds"],
                   (m_bench.get("rss_after_load_bytes") or 0) / gb, (m_bench.get("peak_rss_bytes") or 0) / gb))
    loads = [m_bench["loadavg"]] + [r["loadavg"] for r in m_gen]
    if l_bench:
        loads += l_bench["loadavg"] + [r["loadavg"] for r in l_greedy]
    out.append("")
    out.append("Load average after each timed process (1 / 5 / 15 min): %s." % "; ".join(loads))
    if agree is not None:
        out.append("")
        out.append("Greedy agreement: the first %d of %d greedy ids agree." % (agree, n_agree))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moex", required=True, help="the moex binary (a CPU or CUDA build)")
    ap.add_argument("--work", required=True, help="cache of checkpoints, GGUFs and the greedy driver")
    ap.add_argument("--models", default="qwen2_moe,olmoe")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--llama-cpp", default="", help="llama.cpp source tree; without it only moex runs")
    ap.add_argument("--llama-build", default="", help="its build directory (default DIR/build)")
    ap.add_argument("--skip-build", action="store_true", help="use the llama.cpp build as it is")
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs of the llama.cpp build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agree-tokens", type=int, default=32, help="greedy ids compared (<= --new-tokens)")
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="tokenizer.json saved with the checkpoints")
    ap.add_argument("--pre-tokenizer", default="qwen2", help="llama.cpp's name for that tokenizer's split")
    ap.add_argument("--seed", type=int, default=0, help="of the prompt ids (with the model's name)")
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()
    if a.threads < 1 or a.prompt_tokens < 1 or a.new_tokens < 2 or a.repeats < 1:
        ap.error("--threads, --prompt-tokens, --repeats must be >= 1 and --new-tokens >= 2")
    models = [resolve(m) for m in a.models.split(",") if m]
    moex = os.path.abspath(a.moex)
    if not os.access(moex, os.X_OK):
        ap.error("--moex %s is not an executable" % a.moex)
    os.makedirs(a.work, exist_ok=True)
    import torch
    import transformers

    llama = None
    if a.llama_cpp:
        src = os.path.abspath(a.llama_cpp)
        build = os.path.abspath(a.llama_build or os.path.join(src, "build"))
        if not a.skip_build:
            build_llama(src, build, a.jobs)
        greedy_bin = os.path.join(a.work, "llama_greedy")
        if not a.skip_build or not os.access(greedy_bin, os.X_OK):
            build_greedy(src, build, greedy_bin)
        llama = dict(src=src, bench=os.path.join(build, "bin", "llama-bench"), greedy=greedy_bin,
                     commit=llama_commit(src))
    else:
        log("no --llama-cpp given: llama.cpp is skipped, only moex runs")

    def save():
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump(dict(results=results, llama_cpp=llama, threads=a.threads), f, indent=1)

    # moex for every model first, then llama.cpp for every model: one engine's pages (mapped
    # checkpoint, packed weights) are gone before the other starts, and each phase's numbers are
    # saved (--json-out) as soon as they exist.
    results = {}
    for model in models:
        key = checkpoint_key(model, a.layers, tokenizer_file=a.tokenizer)
        ckpt = make_checkpoint(model, a.layers, os.path.join(a.work, key), torch, transformers,
                               tokenizer_file=a.tokenizer)
        with open(os.path.join(ckpt, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        # Seeded by (seed, model), so a model's prompt does not depend on which others run.
        rng = random.Random("%d:%s" % (a.seed, model))
        ids = [rng.randrange(vocab) for _ in range(a.prompt_tokens)]
        res = dict(model=model, key=key, checkpoint=ckpt, prompt_ids=ids, prompt_ids_seed=a.seed)
        res["moex_bench"] = time_moex_bench(moex, ckpt, a.threads, a.prompt_tokens, a.new_tokens, a.repeats)
        res["moex_generate"] = time_moex_generate(moex, ckpt, a.threads, ids, a.new_tokens, a.repeats)
        results[model] = res
        save()
    n = min(a.agree_tokens, a.new_tokens)
    for model in models:
        res = results[model]
        l_bench = l_greedy = agree = None
        if llama:
            if not os.access(llama["bench"], os.X_OK):
                sys.exit("error: %s is missing; build llama.cpp (drop --skip-build)" % llama["bench"])
            gguf = os.path.join(a.work, res["key"] + ".bf16.gguf")
            convert_gguf(llama["src"], res["checkpoint"], gguf, a.pre_tokenizer)
            l_bench = time_llama_bench(llama["bench"], gguf, a.threads, a.prompt_tokens, a.new_tokens,
                                       a.repeats, a.work)
            l_greedy = time_llama_greedy(llama["greedy"], gguf, a.threads, res["prompt_ids"], a.new_tokens,
                                         a.repeats)
            m_ids, l_ids = res["moex_generate"][0]["ids"][:n], l_greedy[0]["ids"][:n]
            agree = agreement(m_ids, l_ids)
            print("greedy ids, %s (prompt: %d random ids, seed %d):\n  moex:      %s\n  llama.cpp: %s\n  "
                  "agree for the first %d of %d" % (model, len(res["prompt_ids"]), a.seed, m_ids, l_ids, agree, n),
                  flush=True)
            res.update(gguf=gguf, llama_bench=l_bench, llama_greedy=l_greedy, greedy_agree=agree)
            save()
        print(table(model, res["moex_bench"], res["moex_generate"], l_bench, l_greedy, agree, n), flush=True)
        print(flush=True)
    print("threads %d, prompt %d tokens, %d new tokens, median of %d; load average at the end %s" % (
        a.threads, a.prompt_tokens, a.new_tokens, a.repeats, loadavg()))
    if llama:
        print("llama.cpp %s (%s)" % (llama["commit"], llama["src"]))
    save()


if __name__ == "__main__":
    main()
