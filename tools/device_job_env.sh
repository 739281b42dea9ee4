# Sourced first by the device jobs (`. tools/device_job_env.sh "$@"`, from the repository root): sets W, the work
# folder ($1, else $OUT), defines log (a line and the time into $W/status.log), writes $W/versions.txt (GPU, torch,
# Triton, transformers) and logs the start.
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
log start
