#!/usr/bin/env bash
# Fresh machine to first result: install what is missing, build, run the main job (generation on
# the bundled tiny qwen2_moe checkpoint with every experts backend, tokens/s table).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
bash tools/build.sh
bash tools/main_job.sh
