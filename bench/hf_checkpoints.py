"""Random-weight Hugging Face checkpoints in the shapes of public MoE models, made by transformers.

Shared by the side-by-side benchmarks (e2e_side_by_side.py on the GPU against transformers,
cpu_side_by_side.py on the host against llama.cpp). A checkpoint is what save_pretrained writes
(config.json + safetensors with one tensor per expert, the hub layout), so every engine loads the
files users download. Weights are random: speed does not depend on their values, and greedy
agreement between two engines still shows that both compute the same function.

A checkpoint lives in a directory named by its model, depth, dtype and a short hash of everything
that shapes it (config fields, seed, tokenizer file), so a changed recipe never reuses a stale one
and an unchanged one is made once.
"""
import hashlib
import json
import os
import shutil
import sys
import time

# Shapes of the public models (config fields as transformers names them); `layers` overrides the
# depth so that a shape fits the time and memory at hand.
MODELS = {
    "qwen1.5-moe-a2.7b": ("qwen2_moe", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
        max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True,
        decoder_sparse_step=1, tie_word_embeddings=False)),
    "olmoe-1b-7b": ("olmoe", dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
        norm_topk_prob=False, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
        clip_qkv=None, tie_word_embeddings=False)),
    "mixtral-8x7b": ("mixtral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=8,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    "deepseek-v3": ("deepseek_v3", dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=128,
        num_key_value_heads=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
        n_group=8, topk_group=4, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, routed_scaling_factor=2.5, norm_topk_prob=True,
        max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "gpt-oss-20b": ("gpt_oss", dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
        num_experts_per_tok=4, sliding_window=128, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=False)),
}

# Short names (transformers' model_type) for the shapes above.
ALIASES = {"qwen2_moe": "qwen1.5-moe-a2.7b", "olmoe": "olmoe-1b-7b", "mixtral": "mixtral-8x7b",
           "deepseek_v3": "deepseek-v3", "gpt_oss": "gpt-oss-20b"}


def log(*a):
    print("#", *a, file=sys.stderr, flush=True)


def resolve(model):
    """A MODELS key from a key or an alias; ValueError naming the known ones."""
    name = ALIASES.get(model, model)
    if name not in MODELS:
        raise ValueError("unknown model %r; known: %s" % (model, ", ".join(sorted(set(MODELS) | set(ALIASES)))))
    return name


def checkpoint_key(model, layers=0, dtype="bfloat16", tokenizer_file=None, seed=0):
    """Directory name of a checkpoint: readable prefix + hash of the whole recipe."""
    name = resolve(model)
    model_type, fields = MODELS[name]
    recipe = dict(model=name, model_type=model_type, fields=fields, layers=layers, dtype=dtype, seed=seed)
    if tokenizer_file:
        with open(tokenizer_file, "rb") as f:
            recipe["tokenizer_sha256"] = hashlib.sha256(f.read()).hexdigest()
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    return "%s%s-%s-%s" % (name, "-%dl" % layers if layers else "", dtype, digest)


def make_checkpoint(model, layers, path, torch, transformers, tokenizer_file=None, seed=0):
    """Writes the checkpoint to `path` unless it is already complete there.

    tokenizer_file: a tokenizer.json saved beside the weights (tokenizer.json +
    tokenizer_config.json), for engines whose converters need one; its vocabulary must not exceed
    the model's. Stop tokens are cleared in config.json and generation_config.json, so every
    engine decodes exactly the tokens it is asked for.
    """
    done = os.path.join(path, ".complete")
    if os.path.exists(done):
        log("using", path)
        return path
    name = resolve(model)
    model_type, fields = MODELS[name]
    fields = dict(fields)
    if layers:
        fields["num_hidden_layers"] = layers
    cfg = transformers.AutoConfig.for_model(model_type, **fields)
    cfg.eos_token_id = None
    cfg.bos_token_id = None
    cfg.pad_token_id = None
    cfg.dtype = "bfloat16"
    t0 = time.time()
    torch.manual_seed(seed)
    # Built on the GPU where there is one (fast init); a partial directory from an interrupted
    # run is removed first, and .complete is written last.
    shutil.rmtree(path, ignore_errors=True)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    m.generation_config.eos_token_id = None
    m.generation_config.bos_token_id = None
    m.generation_config.pad_token_id = None
    # 5 GB shards, as on the hub: a shard at a time passes through host memory.
    m.save_pretrained(path, max_shard_size="5GB")
    del m
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if tokenizer_file:
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
        if len(tok) > fields["vocab_size"]:
            raise ValueError("tokenizer %s has %d tokens, more than the model's vocab_size %d" % (
                tokenizer_file, len(tok), fields["vocab_size"]))
        tok.save_pretrained(path)
    with open(done, "w") as f:
        f.write("%s\n" % name)
    log("made %s in %.0f s" % (path, time.time() - t0))
    return path
