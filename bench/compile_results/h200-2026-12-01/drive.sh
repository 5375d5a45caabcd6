#!/bin/bash
# Device driver for issue 16: full flash-attn 2.8.3 build for sm_120 at the planner's choice,
# then a sweep on a representative subset. Results in /root/r16. Usage: drive.sh DEADLINE_EPOCH
set -u
DEADLINE=$1; R=/root/r16; D=$(cd "$(dirname "$0")" && pwd)
mkdir -p $R; W=/tmp/fa16; rm -rf $W; mkdir -p $W
tar xzf $D/flash_attn-2.8.3.tar.gz -C $W
FA=$W/flash_attn-2.8.3; cd $FA
{ date -u +%FT%TZ; nproc; grep -E 'MemTotal|MemAvailable' /proc/meminfo; nvcc --version | tail -2;
  python3 -c 'import torch;print(torch.__version__, torch.version.cuda)'; uname -r;
  cat /sys/fs/cgroup/cgroup.subtree_control 2>&1; } > $R/env.txt 2>&1
echo "+memory" > /sys/fs/cgroup/cgroup.subtree_control 2>>$R/env.txt
export FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=120 TORCH_CUDA_ARCH_LIST=12.0
export MAX_JOBS=${PLAN_JOBS:-16} NVCC_THREADS=${PLAN_THREADS:-1}
echo "full build start $(date -u +%T) MAX_JOBS=$MAX_JOBS NVCC_THREADS=$NVCC_THREADS" >> $R/progress.txt
python3 $D/compile_sampler.py --out $R/full-j${MAX_JOBS}-t${NVCC_THREADS}.json --cgroup im16-full -- \
  python3 setup.py build_ext --inplace > $R/full.log 2>&1
echo "full build rc=$? end $(date -u +%T)" >> $R/progress.txt
B=$(ls -d $FA/build/temp*/ | head -1)
cp $B/.ninja_log $R/ninja_log.txt; cp $B/build.ninja $R/build.ninja.txt
ls -la $FA/flash_attn_2_cuda*.so >> $R/progress.txt 2>&1
cuobjdump --list-elf $FA/flash_attn_2_cuda*.so 2>&1 | awk '{print $NF}' | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c >> $R/progress.txt
FULL=$(python3 -c "import json;print(json.load(open('$R/full-j${MAX_JOBS}-t${NVCC_THREADS}.json'))['wall_s'])")
echo "sweep start $(date -u +%T)" >> $R/progress.txt
python3 $D/compile_sweep.py --build-dir $B --results $R --deadline $DEADLINE --full-wall $FULL \
  --threads-now $NVCC_THREADS --points ${SWEEP_POINTS:-16x1,24x1,8x1,12x1,16x2} >> $R/progress.txt 2>&1
echo "sweep done $(date -u +%T)" >> $R/progress.txt
touch $R/DONE
