# Sourced first by the device jobs (`. tools/device_job_env.sh "$@"`, from the repository root): sets W, the work
# folder ($1, else $OUT), defines log (a line and the time into $W/status.log), writes $W/versions.txt (GPU, torch,
# Triton, transformers) and logs the start; defines BASE and hybrid_e2e (below).
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
log start
BASE="$PWD/scratch/base_pkg"  # a checkout carried as scratch (laquant/ inside): the "before" of a timed pair
# have_base: whether that checkout is here. scratch/ is git-ignored: a call must name it in run's carry, else a
# PYTHONPATH of a missing BASE silently imports this tree and a "before" would time the "after"
have_base() { [ -f "$BASE/laquant/__init__.py" ] || { echo "no base checkout at $BASE (carry scratch/base_pkg)" >&2; false; }; }
# hybrid_e2e FAMILY TAG [CONFIG [FLAGS...]]: `laquant eval speed`'s e2e of a transformers hybrid (bf16 and hybrid_int8,
# B = 1 and 64, prompt 1,024, 32 decode steps; CONFIG, JSON fields, default tools/family_configs.py's) into
# $W/e2e_FAMILY$TAG; a TAG with _base in it runs the checkout in $BASE, first on PYTHONPATH. E2E_TIMEOUT: seconds (default 150).
hybrid_e2e() {
  local fam=$1 tag=$2 cfg path=$PYTHONPATH
  cfg=${3:-$(python3 tools/family_configs.py "$fam")} || { log "$fam$tag e2e skipped: no config for $fam"; return 1; }
  shift $(($# < 3 ? $# : 3))
  if [[ "$tag" == *_base* ]]; then
    have_base || { log "$fam$tag e2e skipped: no base checkout"; return 1; }
    [ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
    path="$BASE:$PYTHONPATH"
  fi
  PYTHONPATH="$path" timeout "${E2E_TIMEOUT:-150}" laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 \
    --batch 1 64 --prompt 1024 --gen 32 "$@" --model "$fam:$cfg" --out "$W/e2e_$fam$tag" > "$W/e2e_$fam$tag.log" 2>&1
  log "$fam$tag e2e rc $?"
}
# private_pkg DIR: this tree's package (laquant with kernels, recipes and eval inside, as scratch/base_pkg is built) in
# DIR, for a job that writes into the package (tools/sweep_step_tiles.py --write): the device tool copies this
# machine's tree over the device's at every call, so what a job wrote into the tree itself is lost at the next poll.
# Run with PYTHONPATH="DIR:$PYTHONPATH".
private_pkg() {
  rm -rf "$1" && mkdir -p "$1" && cp -r laquant "$1/laquant" && rm -rf "$1/laquant/kernels" "$1/laquant/recipes" \
    "$1/laquant/eval" && cp -r kernels "$1/laquant/kernels" && cp -r recipes "$1/laquant/recipes" \
    && mkdir -p "$1/laquant/eval" && (cd eval && tar cf - --exclude=results .) | (cd "$1/laquant/eval" && tar xf -)
}
# launch_e2e TAG KERNEL:FORMAT:BKxW[p] ARGS...: `laquant eval speed --suite e2e ARGS` with that one decode launch at
# B = 64 (tools/with_decode_launch.py), into $W/e2e_TAG: a launch timed end to end against another in one job.
# E2E_TIMEOUT: seconds (default 110).
launch_e2e() {
  local tag=$1 launch=$2
  shift 2
  PYTHONPATH="tools:${PYTHONPATH:-}" timeout "${E2E_TIMEOUT:-110}" python3 tools/with_decode_launch.py "$launch" \
    eval speed --suite e2e "$@" --out "$W/e2e_$tag" > "$W/e2e_$tag.log" 2>&1
  log "e2e $tag rc $?"
}
