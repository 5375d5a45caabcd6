#!/bin/bash
# The project's in-image GPU harness against the host's torch 2.11 on the H200, for an sm_90
# fixture cell (cudakern built for sm_90), and as a control the same kernel built for sm_120 only.
ROOT=$(pwd)
echo "== $(date -u +%FT%TZ) host: $(hostname) kernel $(uname -r)"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
python3 -c 'import torch,triton;print("torch",torch.__version__,"cuda",torch.version.cuda,"triton",triton.__version__)'
nvcc --version | tail -2
echo "harness sha256: $(sha256sum src/infermatrix/harness/gpu_check.py)"
for A in 90 120; do
  rm -rf /tmp/ck$A && cp -r tests/fixtures/cudakern /tmp/ck$A && cd /tmp/ck$A
  echo "== build cudakern for sm_$A: CUDAKERN_ARCHS=$A MAX_JOBS=4 python3 -m pip wheel --no-build-isolation --no-deps"
  CUDAKERN_ARCHS=$A MAX_JOBS=4 python3 -m pip wheel -q --no-build-isolation --no-deps -w /tmp/ckw$A . 2>&1 | tail -3
  python3 -m pip install -q --no-deps --no-index --target /tmp/cksite$A /tmp/ckw$A/*.whl 2>&1 | tail -2
  # run as the image does, from a folder holding only harness/ (src/infermatrix/selectors.py
  # would shadow the stdlib module)
  mkdir -p /tmp/h && cp -r $ROOT/src/infermatrix/harness /tmp/h/ && cd /tmp/h
  echo "== PYTHONPATH=/tmp/cksite$A python3 -m harness.gpu_check --arch sm_90 --kernels cudakern"
  PYTHONPATH=/tmp/cksite$A python3 -m harness.gpu_check --arch sm_90 --kernels cudakern; echo "exit code: $?"
  cd $ROOT
done
