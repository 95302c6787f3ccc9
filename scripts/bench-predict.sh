#!/usr/bin/env bash
# How long `memfit predict` takes to answer, per model: every preset and every config in
# workloads/configs, without and with `--fit-in` (the searches for the largest batch, sequence
# and context), wall and user CPU seconds (median of RUNS), and each answer's ratio to the
# dense reference (Llama-3-8B) in the same run and mode. Prints a Markdown table for
# BENCHMARKS.md. Decoders: bf16 on cuda:0 with efficient attention, B 1 × S 4096, phases
# prefill, decode, train-step at S 4096, or the longest of 2048, 1024, 112 its position table
# takes with 16 decode tokens (the table's S column says which; SEQ forces one); ViTs: their
# image, B 1, train-step and inference. A model memfit refuses is a row saying why, not a failed
# benchmark.
#
#   scripts/bench-predict.sh                 # ≈ 3 minutes on 2 cores
#   RUNS=5 FIT_IN=400GiB scripts/bench-predict.sh
#   PRESETS="llama-tiny" CONFIGS="" REFERENCE=llama-tiny RUNS=1 scripts/bench-predict.sh
source "$(dirname "$0")/bench-common.sh"
RUNS="${RUNS:-3}"
FIT_IN="${FIT_IN:-80GiB}"
REFERENCE="${REFERENCE:-llama-3-8b}"
PRESETS="${PRESETS-tiny small gpt2-small gpt2-medium llama-7b-shape vit-tiny vit-s16 vit-b16 vit-l16 llama-tiny llama-2-7b llama-2-70b llama-3-8b llama-3.2-1b mistral-7b qwen2-0.5b tinyllama-1.1b smollm2-135m}"
CONFIGS="${CONFIGS-$(cd "$ROOT" && ls workloads/configs/*.json | tr '\n' ' ')}"
build_bins
memfit="$BIN_DIR/memfit-metered"

# The flags of one model: a preset name or a config.json path.
declare -A seq_of
seq_for() {
  local m="$1" s src
  [[ "$m" == *.json ]] && src=(--hf-config "$ROOT/$m") || src=(--preset "$m")
  for s in ${SEQ:-4096 2048 1024 112}; do
    if "$memfit" predict "${src[@]}" --batch 1 --seq "$s" --phases decode > /dev/null 2>&1; then
      echo "$s"; return
    fi
  done
  echo "${SEQ:-4096}"
}
flags_of() {
  local m="$1" s="${seq_of[$1]:-}"
  if [[ "$m" == *.json ]]; then
    echo "--hf-config $ROOT/$m --batch 1 --seq $s --dtype bf16 --device cuda:0 --attention efficient --phases prefill,decode,train-step"
  elif [[ "$m" == vit-* ]]; then
    echo "--preset $m --batch 1 --dtype bf16 --device cuda:0 --phases train-step,inference"
  else
    echo "--preset $m --batch 1 --seq $s --dtype bf16 --device cuda:0 --attention efficient --phases prefill,decode,train-step"
  fi
}

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# MODEL MODE -> "wall user" medians over RUNS (MODE: plain or fit)
time_one() {
  local m="$1" mode="$2" walls=() users=() extra=()
  [[ "$mode" == fit ]] && extra=(--fit-in "$FIT_IN")
  local TIMEFORMAT='%R %U' t
  for _ in $(seq "$RUNS"); do
    # shellcheck disable=SC2046
    # shellcheck disable=SC2046
    if ! "$memfit" predict $(flags_of "$m") "${extra[@]}" > /dev/null 2> "$err"; then
      echo "- - $(tail -n 1 "$err")"
      return 0
    fi
    t="$( { time locked "$memfit" predict $(flags_of "$m") "${extra[@]}" > /dev/null 2>&1; } 2>&1 )"
    walls+=("${t% *}"); users+=("${t#* }")
  done
  echo "$(printf '%s\n' "${walls[@]}" | median) $(printf '%s\n' "${users[@]}" | median)"
}

err="$(mktemp)"
trap 'rm -f "$err"' EXIT
models=()
for p in $PRESETS; do models+=("$p"); done
for c in $CONFIGS; do models+=("$c"); done
declare -A wall user refused
for m in "${models[@]}" "$REFERENCE"; do
  [[ "$m" == vit-* ]] || seq_of[$m]="${seq_of[$m]:-$(seq_for "$m")}"
  for mode in plain fit; do
    [[ -n "${wall[$m/$mode]:-}" ]] && continue
    read -r w u why < <(time_one "$m" "$mode")
    wall[$m/$mode]="$w"; user[$m/$mode]="$u"
    [[ -n "${why:-}" ]] && refused[$m]="$why"
  done
done

echo "predict timings: $(machine), RUNS=$RUNS (median), --fit-in $FIT_IN; ratio: wall over $REFERENCE's in the same mode"
echo
echo "| model | S | wall s | user s | × $REFERENCE | wall s --fit-in | user s --fit-in | × $REFERENCE --fit-in |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for m in "${models[@]}"; do
  row="| $(basename "$m") | ${seq_of[$m]:-image} |"
  if [[ -n "${refused[$m]:-}" ]]; then
    echo "$row refused: ${refused[$m]//|/\\|} | | | | | |"
    continue
  fi
  for mode in plain fit; do
    ratio="$(awk -v a="${wall[$m/$mode]}" -v b="${wall[$REFERENCE/$mode]}" 'BEGIN { if (b > 0 && a != "-") printf "%.1f×", a / b; else printf "—" }')"
    row+=" ${wall[$m/$mode]} | ${user[$m/$mode]} | ${ratio} |"
  done
  echo "$row"
done
