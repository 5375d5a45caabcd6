#!/bin/bash
# Device driver, session 2 of issue 16: the full flash-attn 2.8.3 sm_120 build at 24 x 1 (one
# more measured point beside session 1's 16 x 1), then session 1's 8-TU subset at 16 x 1 and
# 16 x 2 side by side (NVCC_THREADS with one target). Results in /root/r16b. Usage: drive.sh DEADLINE
set -u
DEADLINE=$1; R=/root/r16b; D=$(cd "$(dirname "$0")" && pwd); B16=$D/../..
mkdir -p $R; W=/tmp/fa16; rm -rf $W; mkdir -p $W
tar xzf $D/flash_attn-2.8.3.tar.gz -C $W
FA=$W/flash_attn-2.8.3; cd $FA
{ date -u +%FT%TZ; nproc; grep -E 'MemTotal|MemAvailable' /proc/meminfo; nvcc --version | tail -2;
  python3 -c 'import torch;print(torch.__version__, torch.version.cuda)'; uname -r; } > $R/env.txt 2>&1
echo "+memory" > /sys/fs/cgroup/cgroup.subtree_control 2>>$R/env.txt
export FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=120 TORCH_CUDA_ARCH_LIST=12.0
export MAX_JOBS=24 NVCC_THREADS=1
echo "full build start $(date -u +%T) MAX_JOBS=$MAX_JOBS NVCC_THREADS=$NVCC_THREADS" >> $R/progress.txt
python3 $B16/compile_sampler.py --out $R/full-j24-t1.json --cgroup im16-full24 -- \
  python3 setup.py build_ext --inplace > $R/full.log 2>&1
echo "full build rc=$? end $(date -u +%T)" >> $R/progress.txt
B=$(ls -d $FA/build/temp*/ | head -1)
cp $B/.ninja_log $R/ninja_log.txt
cuobjdump --list-elf $FA/flash_attn_2_cuda*.so 2>&1 | awk '{print $NF}' | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c >> $R/progress.txt
echo "sweep start $(date -u +%T)" >> $R/progress.txt
python3 $B16/compile_sweep.py --build-dir $B --results $R --deadline $DEADLINE --full-wall 715 \
  --threads-now 1 --points 16x1,16x2 --subset flash_fwd_split_hdim64_fp16_sm80.o,flash_fwd_split_hdim96_bf16_sm80.o,flash_bwd_hdim64_bf16_sm80.o,flash_fwd_split_hdim256_bf16_causal_sm80.o,flash_fwd_split_hdim192_fp16_causal_sm80.o,flash_fwd_hdim192_bf16_sm80.o,flash_fwd_hdim192_fp16_sm80.o,flash_fwd_hdim64_fp16_causal_sm80.o >> $R/progress.txt 2>&1
echo "sweep done $(date -u +%T)" >> $R/progress.txt
touch $R/DONE
