#!/usr/bin/env bash
# The main job: generation on a small bundled model (the tiny qwen2_moe checkpoint made by
# transformers, tests/data/hf-tiny) with every registered experts backend, then a table of
# tokens/s. Each run is greedy from the same prompt, so every backend must print the same tokens;
# the script checks that and fails otherwise.
#
# Env: MOEX_BIN (default build/moex; built with tools/build.sh when missing), MODEL (checkpoint
# folder), NEW_TOKENS (default 128), DTYPE (default: the checkpoint's), DEVICE (default cpu),
# BACKENDS (default: eager batched_mm grouped_mm).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${MOEX_BIN:-build/moex}"
model="${MODEL:-tests/data/hf-tiny/qwen2_moe/checkpoint_fp32}"
new_tokens="${NEW_TOKENS:-128}"
prompt="1,20,33,4,150,6,77,8,9,100,11"
[ -x "$bin" ] || bash tools/build.sh
backends="${BACKENDS:-eager batched_mm grouped_mm}"

extra=()
[ -n "${DTYPE:-}" ] && extra+=(--dtype "$DTYPE")
[ -n "${DEVICE:-}" ] && extra+=(--device "$DEVICE")

# Pulls a number or an array out of moex's one-line JSON without needing python or jq.
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2"; }
seq_of() { sed -n 's/.*"sequences":\[\[\([0-9,]*\)\]\].*/\1/p' <<<"$1"; }

echo "model: $model  prompt: 11 tokens  new tokens: $new_tokens"
printf '%-12s %12s %14s %14s\n' backend prefill_ms decode_tok/s total_tok/s
first_seq=""
status=0
for b in $backends; do
  # One warm-up run (page cache, thread pool), then the measured one.
  "$bin" generate --model "$model" --prompt-ids "$prompt" --max-new-tokens 4 \
    --experts-implementation "$b" "${extra[@]}" >/dev/null
  out=$("$bin" generate --model "$model" --prompt-ids "$prompt" --max-new-tokens "$new_tokens" \
    --experts-implementation "$b" "${extra[@]}")
  prefill=$(field prefill_seconds "$out")
  printf '%-12s %12.2f %14.1f %14.1f\n' "$b" "$(awk "BEGIN{print $prefill*1000}")" \
    "$(field decode_tokens_per_second "$out")" "$(field tokens_per_second "$out")"
  s=$(seq_of "$out")
  if [ -z "$first_seq" ]; then first_seq="$s"; elif [ "$s" != "$first_seq" ]; then
    echo "error: backend $b generated different tokens than the first backend" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "all backends generated the same $new_tokens tokens"
exit $status
